"""Structured outputs: what a constraint means to the grammar backend (xgrammar), shared by every process.

- `validate(so)` parses a `StructuredOutputsParams` with the backend, without a tokenizer (about 1 ms), and
  refuses what it would reject or silently ignore, with a ValueError naming the field. The frontend and
  the offline `LLM` call it before a request is sent, so no user input reaches a compile error in the
  scheduler by surprise (vLLM's CVE-2025-48942/48943 were exactly that).
- `to_grammar(so)` builds the backend's `Grammar`; the scheduler compiles it against the vocabulary.
- The bitmask layout that crosses the broadcast ring: packed int32 words, bit j of word i allows token
  32*i + j (xgrammar's and llguidance's layout); `unpack_allowed` is its numpy reading.

xgrammar imports torch, so it is imported lazily, inside the functions that need it: the scheduler process
loads it only when the first structured request arrives.
"""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np

from engine.messages import GrammarRows
from engine.sampling_params import StructuredOutputsParams

# JSON-schema keywords xgrammar does not enforce (vLLM refuses the same set rather than ignore them).
UNSUPPORTED_KEYWORDS = frozenset({
    "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "propertyNames", "patternProperties",
})
SUPPORTED_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
# Keywords whose value maps names to subschemas, and keywords whose value is data, not a schema.
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_DATA = frozenset({"enum", "const", "default", "examples", "required", "title", "description", "$comment"})
_BACKEND_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
XGRAMMAR_INSTALL = "pip install --no-deps xgrammar==0.2.8"
XGRAMMAR_MISSING = (f"structured outputs and forced tool calls need xgrammar, which is not installed: "
                    f"{XGRAMMAR_INSTALL} (its triton dependency is for GPUs only)")


def xgrammar_installed() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


def words_per_row(vocab_size: int) -> int:
    """int32 words of one bitmask row."""
    return (vocab_size + 31) // 32


def unpack_allowed(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool [R, vocab_size]: which tokens each packed int32 row [R, W] allows (little-endian bit order)."""
    rows = np.ascontiguousarray(bitmask, dtype="<i4")
    bits = np.unpackbits(rows.view(np.uint8).reshape(rows.shape[0], -1), axis=1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)


def grammar_sample_rows(grammar: GrammarRows, sample_positions: np.ndarray,
                        words: int) -> tuple[np.ndarray, np.ndarray]:
    """(bitmask int32 [R, W], index [R] of each mask row among the step's sampling rows), where
    sample_positions are the positions in SchedulerOutput.reqs of the rows that sample, non-decreasing (a
    request verifying drafts samples at several rows: its k-th mask row goes to its k-th sampling row)."""
    positions = np.frombuffer(grammar.positions, dtype="<i4").astype(np.int64)
    bitmask = np.frombuffer(grammar.bitmask, dtype="<i4").reshape(len(positions), words).astype(np.int32)
    index = np.searchsorted(sample_positions, positions)
    if len(positions) > 1 and (positions[1:] == positions[:-1]).any():
        index += np.arange(len(positions)) - np.searchsorted(positions, positions)    # k-th repeat
    if len(positions) and (index.max() >= len(sample_positions)
                           or not np.array_equal(sample_positions[index], positions)):
        raise RuntimeError("grammar rows name batch positions that do not sample this step")
    return bitmask, index


def _keywords(schema):
    """(keyword, value) of every node of a JSON schema, walked iteratively: property names (the keys of
    `properties`, `$defs`, ...) and data (`enum`, `const`, `default`, ...) are not taken for keywords."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            yield key, value
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in _DATA:
                stack.append(value)


def unsupported_schema_features(schema) -> list[str]:
    """The keywords (and string formats) of a JSON schema that xgrammar would ignore."""
    found = {key for key, _ in _keywords(schema) if key in UNSUPPORTED_KEYWORDS}
    found.update(f"format {value!r}" for key, value in _keywords(schema)
                 if key == "format" and isinstance(value, str) and value not in SUPPORTED_FORMATS)
    return sorted(found)


def external_refs(document) -> list[str]:
    """The `$ref`s of a schema (or of a structural tag's embedded schemas) that point outside the document:
    xgrammar would not fetch them and would silently allow any JSON there. References into the document
    itself ("#", "#/$defs/...") are fine."""
    return sorted({value for key, value in _keywords(document)
                   if key == "$ref" and isinstance(value, str) and not value.startswith("#")})


def _refuse_external_refs(name: str, document) -> None:
    refs = external_refs(document)
    if refs:
        shown = ", ".join(repr(ref[:200]) for ref in refs[:3])
        raise ValueError(f"{name}: the schema refers to another document ($ref {shown}); only references "
                         "inside the schema itself (\"#\", \"#/$defs/...\") are supported")


def with_closed_objects(schema):
    """disable_additional_properties: every object schema without additionalProperties gets false. (xgrammar's
    strict mode, which ringserve always uses, already reads a missing additionalProperties as false; this
    makes it explicit in the schema, as vLLM does.)"""
    schema = json.loads(json.dumps(schema))
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if (node.get("type") == "object" or "properties" in node) and "additionalProperties" not in node:
                node["additionalProperties"] = False
            stack.extend(v for k, v in node.items() if k not in _DATA)
    return schema


def choice_grammar(choices: list[str]) -> str:
    """EBNF accepting exactly one of the strings (each a JSON-escaped EBNF literal)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _document(value) -> object:
    return json.loads(value) if isinstance(value, str) else value


def to_grammar(so: StructuredOutputsParams):
    """The xgrammar Grammar of a constraint. Raises ValueError naming the field when the backend refuses it,
    or when it is not installed."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ValueError(f"structured_outputs: {XGRAMMAR_MISSING}") from None

    kind = so.kind
    name = f"structured_outputs.{kind}"
    try:
        if kind in ("json", "json_object"):
            schema = {"type": "object"} if kind == "json_object" else _document(so.json)
            if kind == "json":
                _refuse_external_refs(name, schema)
                bad = unsupported_schema_features(schema)
                if bad:
                    raise ValueError(f"{name}: the JSON schema uses features the grammar backend (xgrammar) "
                                     f"does not support: {', '.join(bad)}")
                if so.disable_additional_properties:
                    schema = with_closed_objects(schema)
            return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=not so.disable_any_whitespace,
                                                strict_mode=True)
        if kind == "regex":
            return xgr.Grammar.from_regex(so.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_grammar(so.choice))
        if kind == "grammar":
            if "::=" not in so.grammar:
                raise ValueError(f"{name} must be an EBNF grammar (rules written `name ::= ...`, with a `root` "
                                 "rule); Lark grammars are not supported")
            return xgr.Grammar.from_ebnf(so.grammar)
        tag = _document(so.structural_tag)
        _refuse_external_refs(name, tag)
        if isinstance(tag, dict) and "structures" in tag:     # the legacy {structures, triggers} form
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            return xgr.Grammar.from_structural_tag(items, list(tag.get("triggers") or []))
        if isinstance(tag, dict) and tag.get("type") != "structural_tag":
            tag = {"type": "structural_tag", "format": tag}
        return xgr.Grammar.from_structural_tag(json.dumps(tag))
    except ValueError:
        raise
    except (RuntimeError, TypeError, KeyError, xgr.InvalidJSONError, xgr.InvalidStructuralTagError) as e:
        raise ValueError(f"{name} is invalid: {backend_message(e)}") from None


def validate(so: StructuredOutputsParams) -> None:
    """Parse the constraint with the backend (no tokenizer needed); ValueError naming the field if refused."""
    to_grammar(so)


def backend_message(error: BaseException) -> str:
    """xgrammar's C++ error text without its '[hh:mm:ss] /project/cpp/file.cc:NNN: ' prefix."""
    text = str(error).strip()
    if isinstance(error, KeyError):
        return f"missing key {text}"
    return _BACKEND_PREFIX.sub("", text)
