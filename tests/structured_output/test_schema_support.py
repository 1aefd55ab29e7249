"""JSON-schema keywords xgrammar compiles without enforcing are refused (ValueError, HTTP
400) instead of constraining nothing.

Guards the failure where a schema with, say, ``uniqueItems`` or a ``pattern`` next to a
``maxLength`` was accepted and the "constrained" output broke it (``[1, 1]``, an
over-long string). Each refused schema is shown to let xgrammar's own grammar accept a
string that breaks it, so the test keeps meaning something when xgrammar changes; each
accepted schema's grammar refuses its breaking string."""

import json

import jsonschema
import pytest

from tests.structured_output.schemas import PERSON, WEATHER_ARGS
from vllm.model_executor.guided_decoding.compiler import parse_grammar
from vllm.model_executor.guided_decoding.schema_support import unenforced_keywords
from vllm.sampling_params import GuidedDecodingParams

xgr_testing = pytest.importorskip("xgrammar.testing")

ARR = {"type": "array", "items": {"type": "integer"}}
# (schema, a JSON text that breaks it, what the error names)
UNENFORCED = [
    ({**ARR, "uniqueItems": True}, "[1, 1]", r"uniqueItems at /: items are not kept"),
    ({**ARR, "contains": {"const": 5}}, "[1]", r"contains at /"),
    ({"type": "number", "multipleOf": 0.5}, "1.3", r"multipleOf at /: .*integer"),
    ({"type": "string", "format": "regex"}, '"("', r"format at /: format 'regex'"),
    (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        '"abcdefgh"',
        r"minLength/maxLength at /: ignored next to pattern",
    ),  # fmt: skip
    ({"not": {"type": "string"}}, '"s"', r"not at /"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
            "then": {"required": ["b"]},
        },
        '{"a": 1}',
        r"if at /.*then at /",
    ),  # fmt: skip
    (
        {
            "allOf": [
                {
                    "type": "object",
                    "properties": {"x": {"type": "integer", "minimum": 10}},
                    "required": ["x"],
                },
                {"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]},
            ]
        },
        '{"x": 1, "y": 2}',
        r"allOf at /: only a single-branch",
    ),  # fmt: skip
    (
        {
            "type": "object",
            "properties": {"c/d": {"pattern": "^[a-z]+$", "maxLength": 2}},
            "required": ["c/d"],
        },
        '{"c/d": "ABCDE"}',
        r"maxLength at /properties/c~1d: ignored without a \"type\"",
    ),  # fmt: skip
    ({"minimum": 5}, "1", r"minimum at /: ignored without"),
    (
        {
            "$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            "$ref": "#/$defs/A",
            "required": ["a"],
        },
        "{}",
        r"required at /: ignored next to \$ref",
    ),  # fmt: skip
    (
        {"type": "integer", "anyOf": [{"minimum": 5}, {"maximum": 0}]},
        "3",
        r"type at /: ignored next to anyOf",
    ),  # fmt: skip
    (
        {
            "type": "object",
            "properties": {"l": {"type": "array", "items": {**ARR, "uniqueItems": True}}},
            "required": ["l"],
        },
        '{"l": [[1, 1]]}',
        r"uniqueItems at /properties/l/items",
    ),  # fmt: skip
]

# required names missing from properties
UNENFORCED += [
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a", "zz"],
            "additionalProperties": True,
        },
        '{"a": 1}',
        r"required at /: \['zz'\] not in properties",
    ),  # fmt: skip
    ({"type": "object", "required": ["zz"]}, "{}", r"required at /: \['zz'\]"),
]

# Enforced by xgrammar: (schema, a JSON text that breaks it).
ENFORCED = [
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"abcd"'),
    ({"type": "string", "format": "date"}, '"2024-13-45"'),
    ({**ARR, "minItems": 2, "maxItems": 3}, "[1]"),
    (
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
        '{"a": 1, "b": 2}',
    ),  # fmt: skip
    ({"type": "object", "patternProperties": {"^x$": {"type": "string"}}}, '{"x": 1}'),
    ({"allOf": [{"type": "integer", "minimum": 3}]}, "1"),
    (  # property names are strings: a propertyNames schema needs no "type"
        {"type": "object", "propertyNames": {"maxLength": 2}, "additionalProperties": True},
        '{"abc": 1}',
    ),  # fmt: skip
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}], "default": None}, "1"),
    ({"enum": [{"not": 1, "uniqueItems": True}], "default": {"if": 2}}, '{"not": 2}'),
    (PERSON, "{}"),
    (WEATHER_ARGS, '{"city": "Paris", "unit": "kelvin"}'),
]


def _validate(value, schema) -> None:
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())


def _grammar_accepts(schema, text: str) -> bool:
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=True)
    return xgr_testing._is_grammar_accept_string(grammar, text)


@pytest.mark.parametrize("schema,breaking,match", UNENFORCED)
def test_unenforced_keywords_are_refused(schema, breaking, match):
    with pytest.raises(jsonschema.ValidationError):
        _validate(json.loads(breaking), schema)
    assert _grammar_accepts(schema, breaking)  # xgrammar alone would let it through
    with pytest.raises(ValueError, match=r"invalid guided json: .*cannot enforce.*" + match):
        parse_grammar(GuidedDecodingParams(json=schema))
    with pytest.raises(ValueError, match=match):  # the schema as JSON text too
        parse_grammar(GuidedDecodingParams(json=json.dumps(schema)))


@pytest.mark.parametrize("schema,breaking", ENFORCED)
def test_enforced_keywords_are_accepted(schema, breaking):
    with pytest.raises(jsonschema.ValidationError):
        _validate(json.loads(breaking), schema)
    assert not _grammar_accepts(schema, breaking)
    assert unenforced_keywords(schema) == []
    parse_grammar(GuidedDecodingParams(json=schema))


def test_reference_out_of_the_schema_is_refused():
    """xgrammar resolves only references within the schema; another one matched any value
    (not validated with jsonschema here: that would fetch the URL)."""
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}},
              "required": ["a"]}  # fmt: skip
    assert _grammar_accepts(schema, '{"a": [true, "x"]}')
    match = r"\$ref at /properties/a: 'https://example.com/a.json' is not within the schema"
    with pytest.raises(ValueError, match=match):
        parse_grammar(GuidedDecodingParams(json=schema))
    assert unenforced_keywords({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"}) == []


def test_lengths_beside_a_format_are_accepted():
    """pydantic's URL fields (``HttpUrl``, ``AnyUrl``) carry ``minLength`` / ``maxLength``
    beside ``"format": "uri"``: accepted although xgrammar keeps only the format (the
    module's one exception); beside a ``pattern`` the lengths are still refused."""
    url = {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}
    schema = {"type": "object", "properties": {"site": url}, "required": ["site"]}
    assert unenforced_keywords(schema) == []
    parse_grammar(GuidedDecodingParams(json=schema))
    patterned = {"type": "string", "pattern": "^h", "maxLength": 9}
    assert unenforced_keywords(patterned) == ["minLength/maxLength at /: ignored next to pattern"]
