"""Forced tool calls (tool_choice "required" or a named function): the constraint of a
function without parameters (OpenAI defines it as taking an empty parameter list, so the
grammar the engine compiles accepts only ``{}`` as its arguments), the arguments of a
"required" call as re-encoded (non-ASCII characters kept), and a named call's stream
starting after the reasoning.

Guards the failure where such a function's arguments were constrained to any object: the
model invented arguments (``{"type": "weather", "description": "Paris, ...``) until
max_tokens cut the reply, and "required" returned no call at all."""

import pytest

from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.tool_calls import ToolCallStream, parse_tool_calls, tool_mode
from vllm.entrypoints.openai.tool_parsers import get_tool_parser
from vllm.model_executor.guided_decoding.compiler import parse_grammar

xgr_testing = pytest.importorskip("xgrammar.testing")

MSGS = [{"role": "user", "content": "Ping?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMED = {"type": "function", "function": {"name": "ping"}}


def _accepts(choice, ping: dict, text: str) -> bool:
    """Whether the grammar the engine compiles for ``choice`` over the tools ``ping`` and
    get_weather accepts ``text``."""
    req = ChatCompletionRequest(messages=MSGS, tools=[ping, WEATHER], tool_choice=choice)
    _, guided = tool_mode(req)
    return xgr_testing._is_grammar_accept_string(parse_grammar(guided), text)


@pytest.mark.parametrize(
    "ping",
    [
        {"type": "function", "function": {"name": "ping"}},
        {"type": "function", "function": {"name": "ping", "parameters": {}}},
    ],
)
def test_a_function_without_parameters_takes_the_empty_object(ping):
    assert _accepts(NAMED, ping, "{}")
    assert not _accepts(NAMED, ping, '{"host": "a"}')
    assert _accepts("required", ping, '[{"name": "ping", "parameters": {}}]')
    assert not _accepts("required", ping, '[{"name": "ping", "parameters": {"host": "a"}}]')
    # a function with parameters keeps its own schema beside it
    call = '[{"name": "ping", "parameters": {}}, {"name": "get_weather", "parameters": '
    assert _accepts("required", ping, call + '{"city": "Paris"}}]')
    assert not _accepts("required", ping, call + '{"city": 3}}]')


def test_required_arguments_keep_non_ascii_characters():
    """tool_choice "required" re-encodes each call's parameters: non-ASCII characters stay
    as they are (they came back as \\u escapes), as an "auto" parser's arguments and
    upstream's, streamed or not."""
    text = '[{"name": "get_weather", "parameters": {"city": "Zürich 東京", "q": "\\"a\\""}}]'
    want = '{"city": "Zürich 東京", "q": "\\"a\\""}'
    req = ChatCompletionRequest(messages=MSGS, tools=[WEATHER], tool_choice="required")
    mode, _ = tool_mode(req)
    [call] = parse_tool_calls(mode, text)[0]
    assert call.function.arguments == want
    stream = ToolCallStream(mode)
    stream.delta(text[:30], False)
    [delta] = stream.delta(text[30:], True)["tool_calls"]
    assert delta.function.arguments == want
    hermes = get_tool_parser("hermes").extract(
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich 東京", "q": "\\"a\\""}}'
        "</tool_call>"
    )
    assert hermes.calls[0].function.arguments == want


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def test_named_call_deltas_start_after_the_reasoning(tokenizer):
    """A named function's streamed call starts with the first argument text: no tool-call
    delta (id, name, empty arguments) rides on the reasoning chunks before it, as upstream
    sends none while the model reasons; the deltas join to the unstreamed call."""
    from tests.entrypoints.openai.test_serving_chat_stub import _answer

    named = {"type": "function", "function": {"name": "get_weather"}}
    pieces = ["<think>", "Need", " weather", "</think>", "", '{"city"', "", ': "Paris"}']
    body = {"tools": [WEATHER], "tool_choice": named, "reasoning": "qwen3", "tags": [1, 2]}
    [call] = _answer(tokenizer, pieces, **body)["choices"][0]["message"]["tool_calls"]
    deltas = [c["choices"][0]["delta"] for c in _answer(tokenizer, pieces, stream=True, **body)]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Need weather"
    assert not any("tool_calls" in d for d in deltas if "reasoning" in d), deltas
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] and calls[0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city"',
    }
    assert all(set(c) == {"index", "function"} for c in calls[1:]), calls
    assert [c["function"]["arguments"] for c in calls] == ['{"city"', ': "Paris"}']
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
