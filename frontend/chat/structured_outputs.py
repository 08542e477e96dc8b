"""Structured outputs at the API: response_format, vLLM's structured_outputs and the old guided_* fields
become one `StructuredOutputsParams`, or a 400 naming the field.

Precedence follows vLLM: `response_format` stands in for `structured_outputs` when that is unset; here two
sources of a constraint at once (response_format with structured_outputs, or with a guided_* field) are
refused rather than one silently winning. The spec is then parsed by the grammar backend (xgrammar, no
tokenizer: about a millisecond) in a worker thread, so that an invalid schema, regex or grammar, or a
schema feature the backend would ignore, is a 400 here and never reaches the scheduler's compile.
"""

from __future__ import annotations

import asyncio

from engine.sampling_params import CONSTRAINT_FIELDS, StructuredOutputsParams
from engine.structured_spec import validate
from frontend.errors import invalid
from frontend.chat.protocol import SamplingRequest

BACKENDS = ("xgrammar", "auto")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties")


async def structured_outputs(req: SamplingRequest) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's constraint, checked with the backend, and the request field it came from; (None, None)
    when it has none."""
    found, options = _sources(req)
    if not found:
        if options is not None:
            raise invalid("structured_outputs sets options but no constraint; set one of "
                          + ", ".join(CONSTRAINT_FIELDS), "structured_outputs")
        return None, None
    if len(found) > 1:
        names = [param for param, _ in found]
        raise invalid(f"only one structured outputs constraint may be given, but the request sets "
                      f"{' and '.join(names)}", names[1])
    param, fields = found[0]
    fields = {**(options or {}), **fields}
    try:
        params = StructuredOutputsParams(**fields)
    except ValueError as e:
        raise _invalid(e, param) from None
    try:
        await asyncio.to_thread(validate, params)
    except ValueError as e:
        raise _invalid(e, param) from None
    return params, param if param != "structured_outputs" else f"structured_outputs.{params.kind}"


def _invalid(error: ValueError, param: str):
    """StructuredOutputsParams names its own fields (structured_outputs.json, ...); other sources get the
    request field they came from."""
    message = str(error)
    if param == "structured_outputs":
        for kind in (*CONSTRAINT_FIELDS, *_OPTIONS):
            if message.startswith(f"structured_outputs.{kind}"):
                return invalid(message, f"structured_outputs.{kind}")
        return invalid(message, param)
    for kind in CONSTRAINT_FIELDS:
        message = message.replace(f"structured_outputs.{kind}", param)
    return invalid(message, param)


def _sources(req: SamplingRequest) -> tuple[list[tuple[str, dict]], dict | None]:
    """(request field, StructuredOutputsParams fields) for every constraint the request carries, and the
    options of a `structured_outputs` that sets no constraint of its own: as in vLLM, they apply to a
    constraint given by response_format or guided_* (e.g. disable_any_whitespace for a json_schema)."""
    found: list[tuple[str, dict]] = []
    options = None
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        found.append(_response_format(fmt))
    so = req.structured_outputs
    if so is not None:
        if so.whitespace_pattern is not None:
            raise invalid("structured_outputs.whitespace_pattern is not supported by the grammar backend "
                          "(xgrammar); use disable_any_whitespace", "structured_outputs.whitespace_pattern")
        _check_backend(so.backend, "structured_outputs.backend")
        fields = {name: getattr(so, name) for name in (*CONSTRAINT_FIELDS, *_OPTIONS)}
        fields = {k: v for k, v in fields.items() if v is not None}
        if any(fields.get(name) not in (None, False) for name in CONSTRAINT_FIELDS):
            found.append(("structured_outputs", fields))
        else:
            options = {name: fields[name] for name in _OPTIONS}
    if req.guided_whitespace_pattern is not None:
        raise invalid("guided_whitespace_pattern is not supported by the grammar backend (xgrammar)",
                      "guided_whitespace_pattern")
    _check_backend(req.guided_decoding_backend, "guided_decoding_backend")
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, {kind: value}))
    return found, options


def _response_format(fmt) -> tuple[str, dict]:
    if fmt.type == "json_object":
        return "response_format", {"json_object": True}
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise invalid("response_format.json_schema is required when type is 'json_schema'",
                          "response_format.json_schema")
        if fmt.json_schema.schema is None:
            raise invalid("response_format.json_schema.schema is required", "response_format.json_schema.schema")
        return "response_format.json_schema.schema", {"json": fmt.json_schema.schema}
    if fmt.type == "structural_tag":
        if fmt.format is not None:
            return "response_format.format", {"structural_tag": {"type": "structural_tag", "format": fmt.format}}
        if fmt.structures is not None:
            return "response_format.structures", {"structural_tag": {"structures": fmt.structures,
                                                                     "triggers": fmt.triggers or []}}
        raise invalid("response_format of type 'structural_tag' needs `format` (or the legacy `structures` "
                      "and `triggers`)", "response_format.format")
    raise invalid(f"response_format type {fmt.type!r} is not supported; use 'text', 'json_object', "
                  "'json_schema' or 'structural_tag'", "response_format.type")


def _check_backend(backend: str | None, param: str) -> None:
    if backend is not None and backend not in BACKENDS:
        raise invalid(f"{param} {backend!r} is not available; ringserve's grammar backend is xgrammar "
                      f"(give one of {', '.join(BACKENDS)} or leave it unset)", param)
