"""Upstream's ``structured_outputs`` request object mapped onto guided decoding (which
constraint, which 400), ``SamplingParams(structured_outputs=...)``, and the warning that
names a request's ignored fields; no engine (the outputs are checked in
test_structured_output_server.py)."""

import ast
import logging

import pytest

from tests.structured_output.schemas import CHOICES, PERSON, REGEX
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.guided_request import guided_field, guided_params
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.serving_embedding import EmbeddingRequest
from vllm.entrypoints.openai.tool_calls import tool_mode
from vllm.sampling_params import GuidedDecodingParams, SamplingParams, StructuredOutputsParams

MSGS = [{"role": "user", "content": "hi"}]
FMT = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}


def _completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "x", **fields})


@pytest.mark.parametrize(
    "so,kind,value",
    [
        ({"json": PERSON}, "json", PERSON),
        ({"regex": REGEX}, "regex", REGEX),
        ({"choice": CHOICES}, "choice", CHOICES),
        ({"grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"json_object": True}, "json_object", True),
        ({"regex": REGEX, "json_object": False}, "regex", REGEX),
    ],
)
def test_each_key_maps_to_its_constraint(so, kind, value):
    req = _completion(structured_outputs=so)
    gd = guided_params(req)
    assert isinstance(gd, StructuredOutputsParams) and gd.kind == kind
    assert getattr(gd, kind) == value
    assert guided_field(req) == "structured_outputs"
    # the same constraint as the guided_* spelling: the same grammar (cache key)
    if kind != "json_object":
        assert gd.key() == guided_params(_completion(**{f"guided_{kind}": value})).key()


def test_whitespace_option():
    compact = GuidedDecodingParams(json=PERSON, disable_any_whitespace=True).key()
    so = {"json": PERSON, "disable_any_whitespace": True}
    assert guided_params(_completion(structured_outputs=so)).key() == compact
    backend = {"guided_decoding_backend": "xgrammar:disable-any-whitespace"}
    req = _completion(structured_outputs={"json": PERSON}, **backend)
    assert guided_params(req).key() == compact


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"guided_regex": "a"}, "structured_outputs cannot be combined with guided_regex"),
        ({"guided_json": PERSON}, "structured_outputs cannot be combined with guided_json"),
        ({"response_format": FMT}, "structured_outputs cannot be combined with response_format"),
        (
            {"response_format": {"type": "json_object"}},
            "structured_outputs cannot be combined with response_format",
        ),
    ],
)
def test_two_spellings_are_a_400_naming_both(fields, match):
    for req in (
        _completion(structured_outputs={"regex": "a"}, **fields),
        ChatCompletionRequest.model_validate(
            {"messages": MSGS, "structured_outputs": {"regex": "a"}, **fields}
        ),
    ):
        with pytest.raises(APIError, match=match) as e:
            guided_params(req)
        assert (e.value.code, e.value.param) == (400, "structured_outputs")
    # response_format "text" is no constraint: nothing to combine
    req = _completion(structured_outputs={"regex": "a"}, response_format={"type": "text"})
    assert guided_params(req).regex == "a"


@pytest.mark.parametrize(
    "so,match",
    [
        ({"structural_tag": '{"structures": []}'}, "structural_tag is not supported"),
        ({"structural_tag": {"structures": []}, "regex": "a"}, "structural_tag is not supported"),
        ({}, "exactly one of json, regex, choice, grammar, json_object; got none"),
        ({"json_object": False}, "got none"),
        ({"regex": "a", "choice": ["a"]}, r"exactly one .* got \['regex', 'choice'\]"),
        ({"choice": []}, "guided choice must be a non-empty list"),
        ({"regex": ""}, "guided regex must be a non-empty string"),
    ],
)
def test_unservable_structured_outputs_are_a_400(so, match):
    with pytest.raises(APIError, match=match) as e:
        guided_params(_completion(structured_outputs=so))
    assert (e.value.code, e.value.param) == (400, "structured_outputs")


@pytest.mark.parametrize("tag", ['{"structures": [], "triggers": []}', {"structures": []}])
def test_top_level_structural_tag_is_a_400(tag):
    """A chat request's older top-level ``structural_tag`` was ignored (a warning), and the
    reply came back unconstrained with status 200; it is refused like
    ``structured_outputs.structural_tag``."""
    req = ChatCompletionRequest.model_validate({"messages": MSGS, "structural_tag": tag})
    with pytest.raises(APIError, match="structural_tag is not supported") as e:
        guided_params(req)
    assert (e.value.code, e.value.param) == (400, "structural_tag")
    assert guided_params(ChatCompletionRequest.model_validate({"messages": MSGS})) is None


def test_named_tool_with_structured_outputs_is_a_400():
    tools = [{"type": "function", "function": {"name": "f", "parameters": PERSON}}]
    req = ChatCompletionRequest.model_validate(
        {
            "messages": MSGS,
            "tools": tools,
            "tool_choice": "required",
            "structured_outputs": {"regex": "a"},
        }
    )
    with pytest.raises(APIError, match="cannot be combined with .*structured_outputs"):
        tool_mode(req)


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"guided_regex": "[a-z]+"}, "guided_regex"),
        ({"guided_choice": ["a", "b"]}, "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, "guided_grammar"),
        ({"guided_json": {"type": "integer"}}, "guided_json"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_forced_tool_with_a_guided_field_is_a_400(extra, field, choice):
    """A forced tool call with a guided_* field used to drop the guided_* constraint
    silently (the reply was the tool call, status 200); two constraints are a 400 naming
    the other one, as with structured_outputs and response_format."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": PERSON}}]
    body = {"messages": MSGS, "tools": tools, "tool_choice": choice, **extra}
    with pytest.raises(APIError, match=f"cannot be combined with {field}") as e:
        tool_mode(ChatCompletionRequest.model_validate(body))
    assert (e.value.code, e.value.param) == (400, "tool_choice")
    body.pop(next(iter(extra)))
    mode, gd = tool_mode(ChatCompletionRequest.model_validate(body))
    assert gd.kind == "json" and (mode.required or mode.function == "f")
    body["tool_choice"] = "none"  # no forced call: the guided field is the constraint
    mode, gd = tool_mode(ChatCompletionRequest.model_validate({**body, **extra}))
    assert gd is None and not mode.active


def test_sampling_params_structured_outputs():
    so = StructuredOutputsParams(choice=CHOICES)
    p = SamplingParams(structured_outputs=so)
    assert p.guided_decoding is so and p.clone().guided_decoding is so
    with pytest.raises(ValueError, match="two spellings of one constraint"):
        SamplingParams(structured_outputs=so, guided_decoding=GuidedDecodingParams(regex="a"))
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"choice": CHOICES})
    with pytest.raises(ValueError, match="structural_tag is not supported"):
        StructuredOutputsParams(structural_tag="{}")


def _ignored_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "present in the request but ignored" in r.getMessage()
    ]


@pytest.mark.parametrize(
    "model,body,ignored",
    [
        (CompletionRequest, {"prompt": "x", "foo": 1,
                             "structured_outputs": {"regex": "a", "bar": 2}},
         {"foo", "bar"}),
        (ChatCompletionRequest, {"messages": MSGS, "foo": 1, "stream_options": None,
                                 "response_format": {"type": "text", "baz": 1}},
         {"foo", "baz"}),
        (EmbeddingRequest, {"input": "x", "foo": 1}, {"foo"}),
        # known fields and aliases ("schema", "json") are not reported
        (ChatCompletionRequest, {"messages": MSGS, "response_format": FMT, "top_k": 3}, set()),
        (CompletionRequest, {"prompt": "x", "structured_outputs": {"json": PERSON}}, set()),
        # a field's Python name is not an accepted key where an alias replaces it
        (CompletionRequest, {"prompt": "x", "structured_outputs": {"json_schema": PERSON,
                                                                    "regex": "a"}},
         {"json_schema"}),
    ],
)  # fmt: skip
def test_ignored_fields_logged_once_per_request(caplog, model, body, ignored):
    caplog.set_level(logging.WARNING)
    model.model_validate(body)
    warnings = _ignored_warnings(caplog)
    if not ignored:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        prefix = "The following fields were present in the request but ignored: "
        assert warnings[0].startswith(prefix), warnings
        assert ast.literal_eval(warnings[0][len(prefix) :]) == ignored


def test_no_warning_for_a_failed_request_or_a_response(caplog):
    caplog.set_level(logging.WARNING)
    with pytest.raises(ValueError):
        CompletionRequest.model_validate({"foo": 1})  # no prompt: a 400, not a warning
    CompletionRequest(prompt="x", max_tokens=3)
    assert _ignored_warnings(caplog) == []


def test_upstream_options_are_accepted():
    """Upstream's StructuredOutputsParams options ``disable_additional_properties`` and
    ``whitespace_pattern`` (and the older ``disable_fallback``) raised a TypeError offline
    and were dropped from a request's ``structured_outputs`` with a warning; they are
    accepted, and the grammar is the one without them (what upstream's xgrammar backend
    builds)."""
    opts = dict(disable_additional_properties=True, whitespace_pattern=r"[ ]?")
    so = StructuredOutputsParams(json=PERSON, disable_fallback=True, **opts)
    gd = GuidedDecodingParams(json=PERSON, **opts)
    assert so.key() == gd.key() == GuidedDecodingParams(json=PERSON).key()
    assert (so.whitespace_pattern, gd.disable_additional_properties) == (r"[ ]?", True)
    req = _completion(structured_outputs={"json": PERSON, **opts})
    assert guided_params(req).whitespace_pattern == r"[ ]?"
    assert guided_params(req).disable_additional_properties is True
    with pytest.raises(ValueError, match="whitespace_pattern must be a string"):
        GuidedDecodingParams(json=PERSON, whitespace_pattern=3)


def test_comma_separated_backend_options():
    """Upstream's request backend takes comma-separated options after the colon
    ("xgrammar:no-fallback,disable-any-whitespace"); only ":disable-any-whitespace" alone
    was read here, and "no-fallback" / "no-additional-properties" were a 400."""
    gd = GuidedDecodingParams(json=PERSON, backend="xgrammar:no-fallback,disable-any-whitespace")
    assert gd.disable_fallback and gd.disable_any_whitespace
    assert not gd.disable_additional_properties
    gd = GuidedDecodingParams(json=PERSON, backend="auto:no-additional-properties")
    assert gd.backend == "xgrammar:no-additional-properties" and gd.disable_additional_properties
    assert not gd.disable_any_whitespace
    backend = {"guided_decoding_backend": "xgrammar:no-fallback,disable-any-whitespace"}
    compact = GuidedDecodingParams(json=PERSON, disable_any_whitespace=True).key()
    assert guided_params(_completion(guided_json=PERSON, **backend)).key() == compact
    with pytest.raises(APIError, match=r"options after ':'.*got 'xgrammar:bogus'"):
        guided_params(_completion(guided_json=PERSON, guided_decoding_backend="xgrammar:bogus"))
