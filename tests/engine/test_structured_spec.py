"""StructuredOutputsParams (vLLM's names and checks) and engine.structured_spec: backend validation, the
schema features refused rather than ignored, and the wire layout of grammar rows."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from engine import StructuredOutputsParams as Exported
from engine.messages import GrammarRows
from engine.sampling_params import MAX_CHOICES, MAX_JSON_DEPTH, SamplingParams, StructuredOutputsParams
from engine.structured_spec import (
    choice_grammar,
    grammar_sample_rows,
    unsupported_schema_features,
    validate,
    with_closed_objects,
)


def test_exported_from_engine_and_carried_by_sampling_params():
    assert Exported is StructuredOutputsParams
    params = SamplingParams(n=2, structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    assert params.child(1).structured_outputs == params.structured_outputs
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    assert wire.structured_outputs.choice == ["a", "b"]


@pytest.mark.parametrize("fields,message", [
    ({}, "no constraint"),
    ({"json": {"type": "object"}, "regex": "a"}, "only use one kind"),
    ({"choice": ["a"], "grammar": "root ::= \"a\""}, "only use one kind"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": "[1, 2]"}, "must be a JSON object"),
    ({"json": 5}, "must be a JSON object or its text"),
    ({"regex": ""}, "non-empty"),
    ({"regex": "a" * 5000}, "at most 4096"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", 1]}, "non-empty list"),
    ({"choice": [str(i) for i in range(MAX_CHOICES + 1)]}, f"at most {MAX_CHOICES}"),
    ({"choice": ["x" * 2000]}, "at most 1024"),
    ({"grammar": "  "}, "non-empty"),
    ({"json": {"type": "object", "description": "x" * 40000}}, "at most 32768"),
    ({"json_object": True, "disable_any_whitespace": "yes"}, "must be a boolean"),
])
def test_refused_on_construction_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        StructuredOutputsParams(**fields)
    assert str(info.value).startswith("structured_outputs")


def test_nesting_is_bounded_without_recursion():
    deep = {"type": "integer"}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"items": deep}
    with pytest.raises(ValueError, match="nested more than"):
        StructuredOutputsParams(json=deep)
    very_deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError):
        StructuredOutputsParams(json='{"a": ' + very_deep + "}")


def test_json_object_false_is_no_constraint():
    so = StructuredOutputsParams(json_object=False, regex="a+")
    assert so.kind == "regex"


def test_key_is_canonical():
    a = StructuredOutputsParams(json={"b": 1, "a": {"type": "object"}})
    b = StructuredOutputsParams(json='{"a": {"type": "object"},  "b": 1}')
    assert a.key == b.key
    assert a.key != StructuredOutputsParams(json=a.json, disable_any_whitespace=True).key


@pytest.mark.parametrize("schema,found", [
    ({"type": "number", "multipleOf": 2}, ["multipleOf"]),
    ({"type": "array", "uniqueItems": True, "contains": {"type": "integer"}}, ["contains", "uniqueItems"]),
    ({"type": "object", "properties": {"x": {"type": "object", "minProperties": 1}}}, ["minProperties"]),
    ({"type": "string", "format": "credit-card"}, ["format 'credit-card'"]),
    ({"type": "object", "patternProperties": {"^a": {}}}, ["patternProperties"]),
    ({"$defs": {"d": {"type": "object", "maxProperties": 3}}, "$ref": "#/$defs/d"}, ["maxProperties"]),
    # property names and data that merely look like keywords are not features
    ({"type": "object", "properties": {"contains": {"type": "string"}, "format": {"type": "string"}}}, []),
    ({"enum": [{"multipleOf": 3}]}, []),
    ({"type": "string", "format": "date-time"}, []),
])
def test_unsupported_schema_features(schema, found):
    assert unsupported_schema_features(schema) == found


@pytest.mark.parametrize("so,message", [
    (StructuredOutputsParams(json={"type": "strin"}), 'Unsupported type "strin"'),
    (StructuredOutputsParams(json={"type": "object", "properties": {"foo": "bar"}}), "bar"),
    (StructuredOutputsParams(json={"type": "array", "uniqueItems": True}), "uniqueItems"),
    (StructuredOutputsParams(regex="(?<=a)b"), "Lookbehind"),
    (StructuredOutputsParams(regex="(unclosed"), "structured_outputs.regex"),
    (StructuredOutputsParams(grammar='root ::= x'), 'Rule "x" is not defined'),
    (StructuredOutputsParams(grammar="start: WORD"), "EBNF"),
    (StructuredOutputsParams(structural_tag={"type": "nonsense"}), "structured_outputs.structural_tag"),
])
def test_backend_refusals_name_the_field_without_cpp_noise(so, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        validate(so)
    text = str(info.value)
    assert text.startswith(f"structured_outputs.{so.kind}") and "/project/" not in text


@pytest.mark.parametrize("so", [
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
    StructuredOutputsParams(json_object=True),
    StructuredOutputsParams(regex=r"\d{3}"),
    StructuredOutputsParams(choice=['say "hi"', "a|b", "new\nline"]),
    StructuredOutputsParams(grammar='root ::= "a" | "b"'),
    StructuredOutputsParams(structural_tag={"type": "structural_tag",
                                            "format": {"type": "const_string", "value": "hi"}}),
    StructuredOutputsParams(structural_tag=json.dumps({
        "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f>"]})),
])
def test_valid_constraints_pass(so):
    validate(so)


def test_choice_literals_are_escaped():
    import xgrammar as xgr

    grammar = choice_grammar(['say "hi"', "a\\b", "x\ny"])
    matcher_grammar = xgr.Grammar.from_ebnf(grammar)
    assert "root" in str(matcher_grammar)


def test_disable_additional_properties_closes_objects_without_mutating_the_input():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
              "anyOf": [{"properties": {"b": {}}}], "additionalProperties": True}
    closed = with_closed_objects(schema)
    assert closed["additionalProperties"] is True                       # explicit values are kept
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["a"]


def test_grammar_rows_map_to_sampling_rows():
    words = 2
    bitmask = np.arange(6, dtype="<i4").reshape(3, words)
    rows = GrammarRows(positions=np.array([1, 4, 5], "<i4").tobytes(), bitmask=bitmask.tobytes())
    got, index = grammar_sample_rows(rows, np.array([0, 1, 3, 4, 5]), words)
    assert index.tolist() == [1, 3, 4] and np.array_equal(got, bitmask)
    with pytest.raises(RuntimeError, match="do not sample"):
        grammar_sample_rows(rows, np.array([0, 1, 3, 5]), words)
