"""`vllm serve --enable-auto-tool-choice --tool-call-parser NAME` on SmolLM2, end to end,
NAME a hermes parser that a `--tool-parser-plugin` file registers:
the chat template gets tools, chat_template_kwargs and the messages' name, tool_calls and
tool_call_id (seen in the request log); a reply forced by guided_regex into a hermes
<tool_call> block comes back as tool_calls, streamed and not; the raw stream has OpenAI's
shape; continue_final_message with echo continues the last message; streamed with n > 1
(chat and completions, text and tool calls), each choice has one final chunk."""

import json

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_chat_tools_server")

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


# A --tool-parser-plugin file: the server's parser is hermes under a name only it
# registers, with call ids of its own.
PLUGIN = """
import uuid

from vllm.entrypoints.openai.tool_parsers import register_tool_parser
from vllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser


@register_tool_parser("hermes_from_plugin")
class PluginParser(HermesToolParser):
    def call_id(self):
        return "plugin-" + uuid.uuid4().hex

    def extract(self, text):
        found = super().extract(text)
        found.calls = [c.model_copy(update={"id": self.call_id()}) for c in found.calls]
        return found
"""


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    plugin = tmp_path_factory.mktemp("plugin") / "my_parsers.py"
    plugin.write_text(PLUGIN)
    args = ["--device", "cpu", "--max-model-len", "512", "--served-model-name", MODEL]
    args += ["--tool-parser-plugin", str(plugin)]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes_from_plugin"]
    args += ["--trust-request-chat-template"]  # the tests send their own templates
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
    assert call["id"].startswith("plugin-")  # the --tool-parser-plugin's parser made it
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


# Choices of one n > 1 request that finish at different steps: the engine reports every
# choice on every step until the last one ends, so a finished choice is seen again.
PICK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Rome", "Amsterdam Zuid"]}},
                "required": ["city"],
            },
        },
    }
]
PICK_REGEX = (
    r'<tool_call>\{"name": "get_weather", "arguments": '
    r'\{"city": "(Rome|Amsterdam Zuidoost, Netherlands)"\}\}</tool_call>'
)
SAMPLED = {"n": 3, "temperature": 1, "seed": 5}
USAGE = {"stream_options": {"include_usage": True}}  # streamed only


def _finals(chunks: list[dict]) -> dict[int, int]:
    """Per choice index: how many chunks carry its finish_reason."""
    count: dict[int, int] = {}
    for c in chunks:
        for ch in c["choices"]:
            if ch.get("finish_reason") is not None:
                count[ch["index"]] = count.get(ch["index"], 0) + 1
    return count


def _streamed_calls(chunks: list[dict]) -> dict[int, list[dict]]:
    """Per choice index, its tool calls put together from the deltas as a client does."""
    calls: dict[int, dict[int, dict]] = {}
    for c in chunks:
        for ch in c["choices"]:
            for tc in ch["delta"].get("tool_calls") or []:
                call = calls.setdefault(ch["index"], {}).setdefault(
                    tc["index"], {"ids": [], "name": "", "arguments": ""}
                )
                if tc.get("id"):
                    call["ids"].append(tc["id"])
                call["name"] += tc["function"].get("name") or ""
                call["arguments"] += tc["function"].get("arguments") or ""
    return {i: [calls[i][j] for j in sorted(calls[i])] for i in calls}


def _steps(chunks: list[dict]) -> list[int]:
    """Per choice index (0-2): how many chunks name it (its tokens, if sent once each)."""
    return [sum(ch["index"] == i for c in chunks for ch in c["choices"]) for i in range(3)]


def test_stream_n_sends_one_final_chunk_per_choice(server):
    """Regression: with n > 1 a choice that finished before its siblings was sent again,
    finish_reason and all, on every later step."""
    body = {"messages": [{"role": "user", "content": "Say OK"}], "max_tokens": 40, **SAMPLED}
    whole = _post(server, body).json()
    chunks = _sse(server, {**body, **USAGE})
    assert _finals(chunks) == {0: 1, 1: 1, 2: 1}
    assert len(set(_steps(chunks))) > 1  # the choices finished at different steps
    texts = [
        "".join(
            ch["delta"].get("content") or ""
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == i
        )
        for i in range(3)
    ]
    assert texts == [ch["message"]["content"] for ch in whole["choices"]]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_completions_stream_n_sends_one_final_chunk_per_choice(server):
    """Regression: /v1/completions with n > 1 sent a choice's final chunk again on every
    step after it stopped (here at its first '.') until the last sibling ended."""
    body = {"model": MODEL, "prompt": "Say OK", "max_tokens": 40, "stop": ["."], **SAMPLED}
    url = server.url_for("v1", "completions")
    whole = httpx.post(url, json=body, timeout=300).json()
    r = httpx.post(url, json={**body, "stream": True, **USAGE}, timeout=300)
    lines = [x[len("data: ") :] for x in r.text.split("\n\n") if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert _finals(chunks) == {0: 1, 1: 1, 2: 1}
    assert len(set(_steps(chunks))) > 1  # the choices finished at different steps
    texts = ["".join(ch["text"] for c in chunks for ch in c["choices"] if ch["index"] == i)
             for i in range(3)]  # fmt: skip
    assert texts == [ch["text"] for ch in whole["choices"]]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    "choice",
    [
        None,  # "auto" with the hermes parser, its calls forced by a regex
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
    ],
)
def test_stream_n_tool_calls_equal_the_whole_response(server, choice):
    """Regression: with n > 1 and tool calls, a finished choice's calls were sent again
    (with new ids) on every later step. Each choice's calls, put together from the stream,
    equal the non-streamed response's, each with one id."""
    body = {"messages": [MESSAGES[0]], "tools": PICK_TOOLS, "max_tokens": 60, **SAMPLED}
    if choice is None:
        body["guided_regex"] = PICK_REGEX
    else:
        body["tool_choice"] = choice
    whole = _post(server, body).json()
    want = {
        ch["index"]: [
            (tc["function"]["name"], tc["function"]["arguments"])
            for tc in ch["message"]["tool_calls"]
        ]  # fmt: skip
        for ch in whole["choices"]
    }
    chunks = _sse(server, {**body, **USAGE})
    assert _finals(chunks) == {0: 1, 1: 1, 2: 1}
    got = _streamed_calls(chunks)
    assert {i: [(c["name"], c["arguments"]) for c in got.get(i, [])] for i in range(3)} == want, (
        whole
    )
    assert all(len(c["ids"]) == 1 for calls in got.values() for c in calls)
    # the choices' calls differ in length, so they finished at different steps
    assert len({str(calls) for calls in want.values()}) > 1, want
