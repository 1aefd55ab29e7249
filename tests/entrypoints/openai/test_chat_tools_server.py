"""`vllm serve --enable-auto-tool-choice --tool-call-parser hermes` on SmolLM2, end to end:
the chat template gets tools, chat_template_kwargs and the messages' name, tool_calls and
tool_call_id (seen in the request log); a reply forced by guided_regex into a hermes
<tool_call> block comes back as tool_calls, streamed and not; the raw stream has OpenAI's
shape; continue_final_message with echo continues the last message."""

import json

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

MODEL = "smollm2"
TEMPLATE = (
    "{% if tools %}TOOLS={{tools|length}};{% endif %}{% for m in messages %}"
    "<{{m['role']}}|{{m['content']}}|calls={{m.get('tool_calls')}}|id={{m.get('tool_call_id')}}"
    "|name={{m.get('name')}}>{% endfor %}{% if foo is defined %}FOO={{foo}}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "call_1", "type": "function"}
MESSAGES = [
    {"role": "user", "content": "Weather in Paris?", "name": "bob"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]
# exactly one text matches: the hermes call below
CALL_REGEX = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>'


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    args = ["--device", "cpu", "--max-model-len", "512", "--served-model-name", MODEL]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with RemoteOpenAIServer(smollm2_gguf, args) as srv:
        yield srv


def _post(server, body):
    return httpx.post(
        server.url_for("v1", "chat", "completions"), json={"model": MODEL, **body}, timeout=300
    )


def _sse(server, body) -> list[dict]:
    r = _post(server, {**body, "stream": True})
    assert r.status_code == 200, r.text
    lines = [x[len("data: ") :] for x in r.text.split("\n\n") if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_template_gets_tools_kwargs_and_message_fields(server):
    body = {"messages": MESSAGES, "tools": TOOLS, "chat_template": TEMPLATE, "max_tokens": 1}
    r = _post(server, {**body, "chat_template_kwargs": {"foo": "bar"}, "tool_choice": "none"})
    assert r.status_code == 200, r.text
    rendered = (
        "TOOLS=1;<user|Weather in Paris?|calls=None|id=None|name=bob>"
        "<assistant||calls=[{'id': 'call_1', 'type': 'function', 'function': "
        "{'name': 'get_weather', 'arguments': {'city': 'Paris'}}}]|id=None|name=None>"
        "<tool|sunny|calls=None|id=call_1|name=None>FOO=bar"
    )
    line = next(x for x in server.read_log().splitlines() if r.json()["id"] in x)
    assert f"prompt: {rendered!r}, params:" in line


def test_auto_tool_choice_parses_hermes_calls(server):
    body = {
        "messages": [MESSAGES[0]],
        "tools": TOOLS,
        "guided_regex": CALL_REGEX,
        "max_tokens": 64,
        "temperature": 0,
    }
    r = _post(server, body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chunks = _sse(server, body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0][0]["function"] == call["function"]
    assert all("role" not in d for d in deltas[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_stream_shape_and_continue_final_message_with_echo(server):
    msgs = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "A fruit:"},
    ]
    body = {"messages": msgs, "max_tokens": 4, "temperature": 0, "echo": True}
    body.update(add_generation_prompt=False, continue_final_message=True)
    r = _post(server, body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text.startswith("A fruit:") and len(text) > len("A fruit:")
    chunks = _sse(server, body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": "A fruit:"}]
    assert all(list(d) == ["content"] for d in deltas[1:])
    assert "".join(d["content"] for d in deltas) == text
    r = _post(server, {**body, "add_generation_prompt": True})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "continue_final_message"
