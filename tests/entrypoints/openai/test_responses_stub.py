"""POST /v1/responses over a stub engine that replays fixed text pieces (one per token):
the response object and every streamed event validate against the OpenAI client's own
types; the streamed deltas join to the unstreamed items (text, reasoning, a tool call);
an input conversation with function calls and their outputs reaches the chat template as
the equivalent chat messages; parallel_tool_calls false keeps one function_call item;
unsupported fields are 400s naming them, before anything is queued."""

import asyncio
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.entrypoints.openai.test_serving_chat_stub import HERMES, TEMPLATE, _Engine
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.responses_input import ResponsesRequest, chat_messages
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from vllm.entrypoints.openai.tool_parsers import get_tool_parser
from vllm.reasoning import get_reasoning_parser

EVENT = TypeAdapter(ResponseStreamEvent)
FN_TOOL = {"type": "function", "name": "get_weather", "parameters": {}}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _respond(tokenizer, pieces, reasoning=None, hermes=False, finish="stop", **body):
    engine = _Engine(tokenizer, pieces, finish=finish)
    chat = OpenAIServingChat(
        engine, ["m"], chat_template=TEMPLATE,
        tool_parser=get_tool_parser("hermes") if hermes else None,
        reasoning_parser=get_reasoning_parser(reasoning) if reasoning else None,
    )  # fmt: skip
    handler = OpenAIServingResponses(chat)
    req = ResponsesRequest(**{"input": "Weather in Paris?", **body})

    async def run():
        result = await handler.create_response(req, None)
        if not req.stream:
            return result
        events = []
        async for text in result:
            kind, data = text.split("\n")[:2]
            event = json.loads(data[len("data: ") :])
            assert kind == f"event: {event['type']}"
            events.append(event)
        return events

    return asyncio.run(run()), engine


def test_text_response_and_its_stream(tokenizer):
    body, engine = _respond(tokenizer, ["Sunny", ",", " 21 C."], model="m")
    resp = Response.model_validate(body)
    assert resp.output_text == "Sunny, 21 C." and resp.status == "completed"
    assert [item.type for item in resp.output] == ["message"]
    assert resp.usage.output_tokens == 3 and resp.model == "m"
    assert resp.id.startswith("resp_") and engine.request_ids == [resp.id]  # one id in logs
    events, _ = _respond(tokenizer, ["Sunny", ",", " 21 C."], stream=True)
    for e in events:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * 3 + [
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]  # fmt: skip
    joined = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = Response.model_validate(events[-1]["response"])
    assert joined == final.output_text == resp.output_text
    assert final.usage.output_tokens == 3


def test_reasoning_and_tool_call_items(tokenizer):
    pieces = ["<think>Need", " the weather", ".</think>", *HERMES]
    body, _ = _respond(tokenizer, pieces, reasoning="qwen3", hermes=True, tools=[FN_TOOL])
    resp = Response.model_validate(body)
    assert [item.type for item in resp.output] == ["reasoning", "message", "function_call"]
    assert resp.output[0].content[0].text == "Need the weather."
    assert resp.output_text == "Let me check. "
    call = resp.output[2]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    events, _ = _respond(tokenizer, pieces, reasoning="qwen3", hermes=True, tools=[FN_TOOL],
                         stream=True)  # fmt: skip
    for e in events:
        EVENT.validate_python(e)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [d["type"] for d in done] == ["reasoning", "message", "function_call"]
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][2]["arguments"] == call.arguments
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") \
        == "Need the weather."  # fmt: skip


def test_input_items_become_chat_messages():
    req = ResponsesRequest(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "21 C."}]},
        ],
    )  # fmt: skip
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
        {"role": "assistant", "content": [{"type": "text", "text": "21 C."}]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"background": True}, "background", "not supported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input", "input[0].content[0] of type 'input_image' is not supported"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input",
         "input[0] of type 'item_reference'"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input", "role 'wizard'"),
        ({"tools": [{"type": "web_search"}]}, "tools", "tools[0] of type 'web_search'"),
        ({"text": {"format": {"type": "yaml"}}}, "text", "'yaml' is not supported"),
        ({"input": [{"role": ["user"], "content": "x"}]}, "input",
         "input[0].role ['user'] is not known"),
        ({"text": {"format": "json"}}, "text", "text.format must be an object, got 'json'"),
        ({"tool_choice": "required"}, "tool_choice", "needs a non-empty tools list"),
        ({"tools": [FN_TOOL], "tool_choice": "any"}, "tool_choice",
         'tool_choice must be "auto", "none", "required" or {"type": "function", "name": NAME}; '
         "got 'any'."),
        ({"conversation": "conv_1"}, "conversation", "stores no conversations"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1, got 0"),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "maximum context length"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(tokenizer, body, param, words):
    with pytest.raises(APIError) as err:
        _respond(tokenizer, ["x"], **body)
    assert err.value.code == 400 and err.value.param == param, err.value.message
    assert words in err.value.message


@pytest.mark.parametrize(
    "body,param,words,not_words",
    [
        ({"max_output_tokens": 10**6}, "max_output_tokens",
         "(max_output_tokens)", "max_tokens)"),
        ({"input": []}, "input", "input must not be empty", "messages"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "text.format",
         "response_format"),
    ],
)  # fmt: skip
def test_refusals_speak_of_the_responses_fields(tokenizer, body, param, words, not_words):
    """A refusal the chat handler raises names the Responses API's fields, in its param
    and in its message."""
    with pytest.raises(APIError) as err:
        _respond(tokenizer, ["x"], **body)
    assert err.value.param == param and words in err.value.message, err.value.message
    assert not_words not in err.value.message, err.value.message


def test_chat_words_become_responses_words():
    from vllm.entrypoints.openai.serving_responses import as_responses_error

    param, msg = as_responses_error(
        "messages", "messages must not be empty; messages[0] is bad; the Chat Completions API"
    )
    assert param == "input"
    assert msg == "input must not be empty; messages[0] is bad; the Responses API"


def test_the_item_max_output_tokens_cut_is_incomplete(tokenizer):
    """The budget ran out inside a named function's arguments (or the reasoning): that
    item is "incomplete" like the response, streamed or not; earlier items are complete."""
    named = {"type": "function", "name": "get_weather"}
    cut = ['{"city"', ': "Par']
    body, _ = _respond(tokenizer, cut, finish="length", tools=[FN_TOOL], tool_choice=named,
                       max_output_tokens=2)  # fmt: skip
    resp = Response.model_validate(body)
    assert resp.status == "incomplete" and resp.output[-1].type == "function_call"
    assert resp.output[-1].status == "incomplete"
    events, _ = _respond(tokenizer, cut, finish="length", tools=[FN_TOOL], tool_choice=named,
                         max_output_tokens=2, stream=True)  # fmt: skip
    for e in events:
        EVENT.validate_python(e)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][-1]["status"] == "incomplete"
    thinking = ["<think>Need", " the"]
    body, _ = _respond(tokenizer, thinking, reasoning="qwen3", finish="length", max_output_tokens=2)
    assert [(o["type"], o["status"]) for o in body["output"]] == [("reasoning", "incomplete")]
    body, _ = _respond(tokenizer, [*thinking, "</think>", "Sun"], reasoning="qwen3",
                       finish="length", max_output_tokens=4)  # fmt: skip
    assert [(o["type"], o["status"]) for o in body["output"]] == [
        ("reasoning", "completed"), ("message", "incomplete")]  # fmt: skip


def test_parallel_tool_calls_false_keeps_one_function_call(tokenizer):
    """``parallel_tool_calls: false`` reaches the chat handler: a reply with two calls
    gives one ``function_call`` item (the first), streamed or not, as chat does."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    pieces = [call % "Paris", call % "Rome"]
    for parallel, cities in ((True, ["Paris", "Rome"]), (False, ["Paris"])):
        body, _ = _respond(tokenizer, pieces, hermes=True, tools=[FN_TOOL],
                           parallel_tool_calls=parallel)  # fmt: skip
        assert body["parallel_tool_calls"] is parallel
        args = [json.loads(o["arguments"]) for o in body["output"]]
        assert args == [{"city": c} for c in cities], body["output"]
        events, _ = _respond(tokenizer, pieces, hermes=True, tools=[FN_TOOL],
                             parallel_tool_calls=parallel, stream=True)  # fmt: skip
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [json.loads(d["arguments"]) for d in done] == args
