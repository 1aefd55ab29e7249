"""`vllm serve` structured outputs: upstream's structured_outputs object, response_format
(json_object, json_schema) and the guided_* extra fields on /v1/completions and
/v1/chat/completions, chat tool calls
(a named function and "required"), streamed and not, parsed by the official openai
client; every bad constraint is an HTTP 400 naming it and the server keeps serving.
One tiny-model server, started and stopped in a forked child."""

import json
import re

import httpx
import jsonschema
import pytest

from tests.structured_output.schemas import CHOICES, MAX_TOKENS, PERSON, REGEX, WEATHER_ARGS
from tests.utils import RemoteOpenAIServer

COMPACT = {"guided_decoding_backend": "xgrammar:disable-any-whitespace"}
MSGS = [{"role": "user", "content": "Tell me about a pet."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_ARGS},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["utc", "cet"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


def _stream_text(stream) -> tuple[str, str]:
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            delta = getattr(c, "delta", None)
            text += (delta.content or "") if delta is not None else (c.text or "")
            finish = c.finish_reason or finish
    return text, finish


def _stream_tool_calls(stream) -> tuple[dict[int, dict], str]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            assert not c.delta.content, c.delta
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function is not None:
                    call["name"] = d.function.name or call["name"]
                    call["arguments"] += d.function.arguments or ""
    return calls, finish


@pytest.mark.forked
def test_structured_outputs_through_the_server(tiny_llama_dir):
    args = ["--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "512"]
    with RemoteOpenAIServer(tiny_llama_dir, args, env={"VLLM_CPU_KVCACHE_SPACE": "0.05"}) as srv:
        client = srv.get_client()
        common = dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}

        # completions: response_format json_schema, plain and streamed (same greedy text)
        r = client.completions.create(
            prompt="A pet:", extra_body={"response_format": fmt, **COMPACT}, **common
        )
        text = r.choices[0].text
        jsonschema.validate(json.loads(text), PERSON)
        assert r.choices[0].finish_reason == "stop"
        stream = client.completions.create(
            prompt="A pet:", stream=True, extra_body={"response_format": fmt, **COMPACT}, **common
        )
        assert _stream_text(stream) == (text, "stop")

        # guided_regex, guided_choice (completions), guided_json (chat)
        r = client.completions.create(prompt="Code:", extra_body={"guided_regex": REGEX}, **common)
        assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
        r = client.completions.create(
            prompt="Answer:",
            n=3,
            extra_body={"guided_choice": CHOICES, "seed": 3},
            **{**common, "temperature": 1.0},
        )
        assert all(c.text in CHOICES for c in r.choices), [c.text for c in r.choices]
        r = client.chat.completions.create(
            messages=MSGS, extra_body={"guided_json": PERSON, **COMPACT}, **common
        )
        guided_json_text = r.choices[0].message.content
        jsonschema.validate(json.loads(guided_json_text), PERSON)

        # structured_outputs (upstream's current field): the same constraint as guided_*
        # gives the same greedy output; unknown keys are logged, not refused
        outs = {}
        for field, value in (
            ("structured_outputs", {"choice": CHOICES}),
            ("guided_choice", CHOICES),
        ):
            r = client.completions.create(
                prompt="Answer:", extra_body={field: value, "not_a_field": 1}, **common
            )
            outs[field] = r.choices[0].text
        assert outs["structured_outputs"] in CHOICES
        assert outs["structured_outputs"] == outs["guided_choice"]
        assert "present in the request but ignored: {'not_a_field'}" in srv.read_log()
        r = client.completions.create(
            prompt="Code:", extra_body={"structured_outputs": {"regex": REGEX}}, **common
        )
        assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
        so_json = {"json": PERSON, "disable_any_whitespace": True}
        r = client.chat.completions.create(
            messages=MSGS, extra_body={"structured_outputs": so_json}, **common
        )
        assert r.choices[0].message.content == guided_json_text
        stream = client.chat.completions.create(
            messages=MSGS, stream=True, extra_body={"structured_outputs": so_json}, **common
        )
        assert _stream_text(stream) == (guided_json_text, "stop")

        # chat: response_format json_object and json_schema, the latter streamed too
        r = client.chat.completions.create(
            messages=MSGS, response_format={"type": "json_object"}, extra_body=COMPACT, **common
        )
        # any object: a random model may not close it within max_tokens
        text_obj = r.choices[0].message.content
        assert text_obj.startswith("{"), text_obj
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text_obj), dict)
        r = client.chat.completions.create(
            messages=MSGS, response_format=fmt, extra_body=COMPACT, **common
        )
        chat_text = r.choices[0].message.content
        jsonschema.validate(json.loads(chat_text), PERSON)
        stream = client.chat.completions.create(
            messages=MSGS, response_format=fmt, extra_body=COMPACT, stream=True, **common
        )
        assert _stream_text(stream) == (chat_text, "stop")

        # tool calls: a named function
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = client.chat.completions.create(
            messages=MSGS, tools=TOOLS, tool_choice=named, extra_body=COMPACT, **common
        )
        msg = r.choices[0].message
        assert msg.content is None and len(msg.tool_calls) == 1
        call = msg.tool_calls[0]
        assert call.type == "function" and call.id.startswith("chatcmpl-tool")
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)
        stream = client.chat.completions.create(
            messages=MSGS,
            tools=TOOLS,
            tool_choice=named,
            extra_body=COMPACT,
            stream=True,
            **common,
        )
        calls, finish = _stream_tool_calls(stream)
        assert finish == "stop" and list(calls) == [0]
        assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool")
        assert calls[0]["arguments"] == call.function.arguments

        # tool calls: "required" (one or more calls of the listed tools)
        r = client.chat.completions.create(
            messages=MSGS, tools=TOOLS, tool_choice="required", extra_body=COMPACT, **common
        )
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        req_calls = r.choices[0].message.tool_calls
        assert len(req_calls) >= 1
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        for c in req_calls:
            jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
        stream = client.chat.completions.create(
            messages=MSGS,
            tools=TOOLS,
            tool_choice="required",
            extra_body=COMPACT,
            stream=True,
            **common,
        )
        calls, finish = _stream_tool_calls(stream)
        assert finish == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [
            (c.function.name, c.function.arguments) for c in req_calls
        ]

        # bad input: HTTP 400 naming the problem, before anything is queued
        comp_url, chat_url = (
            srv.url_for("v1", "completions"),
            srv.url_for("v1", "chat", "completions"),
        )
        comp = dict(model="tiny", prompt="Hi", max_tokens=4)
        chat = dict(model="tiny", messages=MSGS, max_tokens=4)
        cases = [
            (comp_url, {**comp, "guided_json": {"type": "foo"}}, "foo"),
            (comp_url, {**comp, "guided_json": "{not json"}, "guided json"),
            (comp_url, {**comp, "guided_regex": "a(b"}, "guided regex"),
            (comp_url, {**comp, "guided_grammar": "root ::= "}, "guided grammar"),
            (comp_url, {**comp, "guided_choice": []}, "choice"),
            (comp_url, {**comp, "guided_regex": "a", "guided_choice": ["a"]}, "at most one"),
            (
                comp_url,
                {**comp, "guided_regex": "a", "guided_decoding_backend": "outlines"},
                "outlines",
            ),
            (comp_url, {**comp, "response_format": {"type": "json_schema"}}, "json_schema"),
            (comp_url, {**comp, "stream": True, "guided_regex": "(?<=a)b"}, "Lookbehind"),
            (
                chat_url,
                {
                    **chat,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {
                            "name": "x",
                            "schema": {"type": "object", "properties": {"a": {"type": "nope"}}},
                        },
                    },
                },
                "nope",
            ),
            (chat_url, {**chat, "stream": True, "guided_json": {"type": "foo"}}, "foo"),
            (
                chat_url,
                {
                    **chat,
                    "tools": TOOLS,
                    "tool_choice": {"type": "function", "function": {"name": "missing"}},
                },
                "missing",
            ),
            (chat_url, {**chat, "tool_choice": "required"}, "tools"),
            (
                comp_url,
                {**comp, "structured_outputs": {"regex": "a"}, "guided_regex": "a"},
                "structured_outputs cannot be combined with guided_regex",
            ),
            (
                chat_url,
                {**chat, "structured_outputs": {"regex": "a"}, "response_format": fmt},
                "structured_outputs cannot be combined with response_format",
            ),
            (
                chat_url,
                {
                    **chat,
                    "tools": TOOLS,
                    "tool_choice": "required",
                    "structured_outputs": {"regex": "a"},
                },
                "structured_outputs",
            ),
            (comp_url, {**comp, "structured_outputs": {"structural_tag": "{}"}}, "structural_tag"),
            (comp_url, {**comp, "structured_outputs": {}}, "got none"),
            (
                comp_url,
                {**comp, "structured_outputs": {"regex": "a", "choice": ["a"]}},
                "exactly one",
            ),
            (comp_url, {**comp, "structured_outputs": {"json": {"type": "foo"}}}, "foo"),
            (comp_url, {**comp, "structured_outputs": {"regex": "a(b"}}, "guided regex"),
            (
                chat_url,
                {**chat, "stream": True, "structured_outputs": {"grammar": "root ::= "}},
                "guided grammar",
            ),
            (
                comp_url,
                {**comp, "use_beam_search": True, "structured_outputs": {"regex": "a"}},
                "structured_outputs is not supported with use_beam_search",
            ),
        ]
        for url, body, named_in_message in cases:
            resp = httpx.post(url, json=body, timeout=60)
            assert resp.status_code == 400, (body, resp.text)
            assert named_in_message in resp.json()["error"]["message"], (body, resp.text)
        # the server is still healthy and gives the same constrained output as before
        assert httpx.get(srv.url_for("health"), timeout=10).status_code == 200
        r = client.completions.create(
            prompt="A pet:", extra_body={"response_format": fmt, **COMPACT}, **common
        )
        assert r.choices[0].text == text
