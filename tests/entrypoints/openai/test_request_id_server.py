"""`vllm serve` with upstream's request-id and chat-template flags, on a tiny Llama:

- ``X-Request-Id`` names the request: response ids ``chatcmpl-<id>`` / ``cmpl-<id>``,
  engine ids ``chatcmpl-<id>`` / ``cmpl-<id>-<prompt index>`` (the request log shows
  them), echoed with ``--enable-request-id-headers``; without the header the echoed fresh
  id is the base of the ids, and the body's ``request_id`` is used when no header is sent.
- A second request in flight under the same header runs as ``<id>-<8 hex digits>`` in the
  engine, and both get all their tokens.
- ``--chat-template-content-format openai`` hands the template a list of text parts
  (checked on /tokenize's ids); ``--disable-uvicorn-access-log`` leaves no access line
  even at ``--uvicorn-log-level info``.
"""

import json
import re

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_request_id_server")

# A template that renders a string content as S:<text> and a list of parts as P:<text>...
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}"
    "S:{{ m['content'] }}{% else %}{% for p in m['content'] %}P:{{ p['text'] }}"
    "{% endfor %}{% endif %}{% endfor %}"
)
PARTS = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    args = ["--device", "cpu", "--max-model-len", "512", "--served-model-name", "tiny",
            "--enable-request-id-headers", "--disable-uvicorn-access-log",
            "--uvicorn-log-level", "info", "--chat-template", TEMPLATE,
            "--chat-template-content-format", "openai",
            "--trust-request-chat-template"]  # fmt: skip
    srv = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


def _post(server, path, body, **headers):
    return httpx.post(server.url_for("v1", path), json=body, headers=headers, timeout=120)


def _chat(max_tokens=4, **kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, **kw}  # fmt: skip


def test_header_names_the_request(server):
    r = _post(server, "chat/completions", _chat(), **{"X-Request-Id": "trace-42"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "chatcmpl-trace-42"
    assert r.headers["x-request-id"] == "trace-42"
    r = _post(server, "completions", {"model": "tiny", "prompt": ["a b", "c d"], "max_tokens": 3},
              **{"X-Request-Id": "batch-7"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "cmpl-batch-7" and r.headers["x-request-id"] == "batch-7"
    log = server.read_log()
    for rid in ("chatcmpl-trace-42", "cmpl-batch-7-0", "cmpl-batch-7-1"):
        assert f"Received request {rid}: " in log, rid


def test_without_header_the_echoed_id_is_the_base(server):
    r = _post(server, "chat/completions", _chat())
    assert r.status_code == 200, r.text
    fresh = r.headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", fresh) and r.json()["id"] == f"chatcmpl-{fresh}"
    assert f"Received request chatcmpl-{fresh}: " in server.read_log()
    r = _post(server, "chat/completions", _chat(request_id="from-body"))
    assert r.json()["id"] == "chatcmpl-from-body"
    r = _post(server, "chat/completions", _chat(request_id="from-body"), **{"X-Request-Id": "h"})
    assert r.json()["id"] == "chatcmpl-h"  # the header wins, as upstream


def test_same_header_twice_in_flight(server):
    """The first request streams 400 tokens; a second one with its header arrives
    meanwhile, runs under a suffixed engine id, and neither stream is disturbed."""
    body = _chat(max_tokens=400, ignore_eos=True, stream=True)
    with httpx.stream("POST", server.url_for("v1", "chat/completions"), json=body,
                      headers={"X-Request-Id": "dup"}, timeout=300) as first:  # fmt: skip
        lines = first.iter_lines()
        head = next(line for line in lines if line.startswith("data: "))
        assert json.loads(head[6:])["id"] == "chatcmpl-dup"
        second = _post(server, "chat/completions", _chat(max_tokens=5, ignore_eos=True),
                       **{"X-Request-Id": "dup"})  # fmt: skip
        chunks = [head] + [line for line in lines if line.startswith("data: ")]
    assert second.status_code == 200, second.text
    assert second.json()["id"] == "chatcmpl-dup"
    assert second.json()["usage"]["completion_tokens"] == 5
    assert chunks[-1] == "data: [DONE]"
    parsed = [json.loads(c[6:]) for c in chunks[:-1]]
    assert {p["id"] for p in parsed} == {"chatcmpl-dup"}
    assert sum(1 for p in parsed if p["choices"][0]["delta"].get("content") is not None) >= 400
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"
    log = server.read_log()
    m = re.search(r"Request id chatcmpl-dup is in use: running this request as "
                  r"(chatcmpl-dup-[0-9a-f]{8})\.", log)  # fmt: skip
    assert m, log[-3000:]
    assert f"Received request {m.group(1)}: " in log


def test_openai_content_format_and_no_access_log(server, tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    r = httpx.post(server.url_for("tokenize"), json={
        "model": "tiny", "messages": [{"role": "user", "content": PARTS},
                                      {"role": "assistant", "content": "ok"}],
        "add_generation_prompt": False}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    want = tok.encode("<user>P:helloP:world<assistant>P:ok", add_special_tokens=False)
    assert r.json()["tokens"] == want
    # uvicorn's access line, e.g. 'INFO: 127.0.0.1:49308 - "POST /v1/completions HTTP/1.1" 200 OK'
    assert 'HTTP/1.1" 200' not in server.read_log()


def test_explicit_content_format_mismatch_is_a_400_naming_the_format(server):
    """A template that joins string content (``'|' + content``) fails on the server's
    ``--chat-template-content-format openai`` parts list: a 400 naming the format and
    the value to try. Guards: a bare Jinja TypeError ("can only concatenate str (not
    "list") to str")."""
    concat = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] }}{% endfor %}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "chat_template": concat}  # fmt: skip
    r = _post(server, "chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages"
    assert "chat_template_content_format='openai'" in err["message"]
    assert "can only concatenate str" in err["message"]
    assert "try chat_template_content_format='string'" in err["message"]
