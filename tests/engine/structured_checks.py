"""Independent checks of structured outputs, for the engine, LLM and e2e tests.

A finished ("stop") output must validate on its own terms (jsonschema, re.fullmatch, choice membership,
and a fresh xgrammar matcher that accepts the tokens and terminates); a truncated ("length") output must be
a valid prefix (the fresh matcher accepts every token). The matcher is built here, from the tokenizer, not
taken from the engine, so an engine that fed its own matcher wrong tokens cannot pass.
"""

from __future__ import annotations

import functools
import json
import re

import jsonschema

from engine.models.demo import ensure_demo_model
from engine.sampling_params import StructuredOutputsParams
from engine.structured_spec import to_grammar

BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["ada", "bob", "cy"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
    },
    "required": ["name", "age", "ok", "tags", "code"],
}
REGEX = r"[a-f]{2,4}-[0-9]{1,3}"
CHOICES = ["red", "green", "blue"]
EBNF = 'root ::= "(" num ("+" num)? ")"\nnum ::= [1-9] [0-9]?'
STRUCTURAL_TAG = {"type": "structural_tag", "format": {"type": "tag", "begin": "<n>", "end": "</n>", "content": {
    "type": "json_schema", "json_schema": {"type": "integer", "minimum": 0, "maximum": 99}}}}


def constraints() -> dict[str, StructuredOutputsParams]:
    """One bounded constraint of every kind that random weights must still satisfy."""
    return {
        "json": StructuredOutputsParams(json=BOUNDED_SCHEMA, disable_any_whitespace=True),
        "json_object": StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
        "regex": StructuredOutputsParams(regex=REGEX),
        "choice": StructuredOutputsParams(choice=CHOICES),
        "grammar": StructuredOutputsParams(grammar=EBNF),
        "structural_tag": StructuredOutputsParams(structural_tag=STRUCTURAL_TAG),
    }


@functools.lru_cache(maxsize=4)
def tokenizer_info(path: str | None = None):
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path or ensure_demo_model())
    return tokenizer, xgr.TokenizerInfo.from_huggingface(tokenizer)


def fresh_matcher(so: StructuredOutputsParams, eos_token_ids: list[int], path: str | None = None):
    import xgrammar as xgr

    _, info = tokenizer_info(path)
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(to_grammar(so))
    return xgr.GrammarMatcher(compiled, override_stop_tokens=eos_token_ids)


def check_output(so: StructuredOutputsParams, token_ids: list[int], text: str, finish_reason: str,
                 eos_token_ids: list[int], path: str | None = None) -> None:
    """Assert that a finished output satisfies `so` and that a truncated one is a valid prefix."""
    assert finish_reason in ("stop", "length"), finish_reason
    matcher = fresh_matcher(so, eos_token_ids, path)
    for i, token in enumerate(token_ids):
        assert matcher.accept_token(token), f"token {i} ({token}) of {token_ids} breaks the grammar; text {text!r}"
    if finish_reason != "stop":
        return
    assert matcher.is_terminated(), f"finished output {text!r} did not end the grammar"
    kind = so.kind
    if kind == "json":
        jsonschema.validate(json.loads(text), so.json if isinstance(so.json, dict) else json.loads(so.json))
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif kind == "regex":
        assert re.fullmatch(so.regex, text), text
    elif kind == "choice":
        assert text in so.choice, text
    elif kind == "grammar":
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)?\)", text), text
    elif kind == "structural_tag":
        assert re.fullmatch(r"<n>(0|[1-9][0-9]?)</n>", text), text
