"""`vllm serve --reasoning-parser deepseek_r1` with structured outputs, on the tiny model
whose greedy chat reply generates ``</think>`` a few tokens in (tests/conftest.py
``tiny_think_dir``): by default (``enable_in_reasoning`` false) a ``response_format``
reply thinks unconstrained, its ``reasoning`` is the unconstrained reply's, and its
``content`` is JSON valid against the schema, streamed or not; a chat template that
closes the reasoning in the prompt constrains from the first token (all content). With
``enable_in_reasoning`` true the reply is constrained from the first token: all of it is
the JSON content."""

import json

import httpx
import jsonschema
import pytest

from tests.conftest import THINK_MESSAGES
from tests.structured_output.schemas import PERSON
from tests.utils import RemoteOpenAIServer

FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def _server(model_dir, enable_in_reasoning: bool) -> RemoteOpenAIServer:
    so = {"disable_any_whitespace": True, "enable_in_reasoning": enable_in_reasoning}
    args = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "512",
            "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1",
            "--structured-outputs-config", json.dumps(so),
            "--trust-request-chat-template"]  # fmt: skip
    return RemoteOpenAIServer(model_dir, args)


def _chat(server, **kw) -> dict:
    body = {"model": "tiny", "messages": THINK_MESSAGES, "max_tokens": 160,
            "temperature": 0.0, **kw}  # fmt: skip
    r = httpx.post(server.url_for("v1", "chat", "completions"), json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _stream(server, **kw) -> tuple[str, str]:
    body = {"model": "tiny", "messages": THINK_MESSAGES, "max_tokens": 160,
            "temperature": 0.0, "stream": True, **kw}  # fmt: skip
    url = server.url_for("v1", "chat", "completions")
    with httpx.stream("POST", url, json=body, timeout=300) as s:
        lines = [x[len("data: ") :] for x in s.iter_lines() if x.startswith("data: ")]
    deltas = [json.loads(x)["choices"][0]["delta"] for x in lines[:-1]]
    return "".join(d.get("reasoning") or "" for d in deltas), "".join(
        d.get("content") or "" for d in deltas
    )


@pytest.mark.forked
def test_reasoning_is_free_and_content_is_json(tiny_think_dir):
    with open(f"{tiny_think_dir}/think.json") as f:
        end_at = json.load(f)["end_at"]
    server = _server(tiny_think_dir, enable_in_reasoning=False)
    try:
        free = _chat(server, max_tokens=end_at + 1)["message"]  # up to </think>
        assert free["reasoning"] and free["content"] is None
        choice = _chat(server, response_format=FORMAT)
        msg = choice["message"]
        assert msg["reasoning"] == free["reasoning"], msg
        jsonschema.validate(json.loads(msg["content"]), PERSON)
        assert choice["finish_reason"] == "stop"
        assert _stream(server, response_format=FORMAT) == (msg["reasoning"], msg["content"])
        # guided_json, the older spelling: the same reply
        assert _chat(server, guided_json=PERSON)["message"] == msg
        # the template closes the reasoning in the prompt: constrained from the first token
        with open(f"{tiny_think_dir}/chat_template.jinja") as f:
            closed = f.read() + "{% if add_generation_prompt %}<think>\n\n</think>\n\n{% endif %}"
        msg = _chat(server, response_format=FORMAT, chat_template=closed)["message"]
        assert msg["reasoning"] is None
        jsonschema.validate(json.loads(msg["content"]), PERSON)
    finally:
        server.stop()

    server = _server(tiny_think_dir, enable_in_reasoning=True)
    try:
        msg = _chat(server, response_format=FORMAT)["message"]
        assert msg["reasoning"] is None  # constrained from the first token: all content
        jsonschema.validate(json.loads(msg["content"]), PERSON)
        assert not msg["content"].startswith(free["reasoning"])
    finally:
        server.stop()
