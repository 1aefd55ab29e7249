"""`vllm serve --reasoning-parser deepseek_r1` on a tiny random Llama, whose replies have
no think tags: under deepseek_r1's rule a reply starts in reasoning, so the whole greedy
reply (equal to LLM.chat's text) is ``reasoning`` and ``content`` is null, streamed or
not; ``include_reasoning: false`` drops it. (The split itself, tags cut across tokens,
is tested over a stub engine in test_serving_chat_stub.py.)

The same server runs ``--enable-force-include-usage`` (every stream ends with a usage
chunk), ``--enable-server-load-tracking`` (``GET /load`` back to 0 after requests) and two
``--middleware`` (a class and a function, each stamping a header on every response,
401s of the API key check included), and ``--tool-call-parser pythonic``: a reply forced
by guided_regex into a pythonic call list comes back as tool_calls (the tiny Llama's
tokenizer has no think tokens, so the constraint holds from the first token and the
reply is not split as reasoning)."""

import json

import httpx
import pytest

from tests.utils import RemoteOpenAIServer, run_in_fork

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts and its reference engine runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_reasoning_server")

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]
HELPERS = "tests.entrypoints.openai.middleware_examples"
AUTH = {"Authorization": "Bearer k"}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    args = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
            "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1",
            "--enable-force-include-usage", "--enable-server-load-tracking",
            "--api-key", "k", "--middleware", f"{HELPERS}.StampHeader",
            "--middleware", f"{HELPERS}.stamp_function",
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]  # fmt: skip
    srv = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def offline_text(tiny_llama_dir):
    def run():
        from vllm import LLM, SamplingParams

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=256)
        sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        return llm.chat(MSGS, sp, use_tqdm=False)[0].outputs[0].text

    return run_in_fork(run)


def _chat(server, **kw):
    body = {"model": "tiny", "messages": MSGS, "max_tokens": 12, "temperature": 0.0,
            "ignore_eos": True, **kw}  # fmt: skip
    return httpx.post(server.url_for("v1", "chat", "completions"), json=body, headers=AUTH,
                      timeout=120)  # fmt: skip


def test_whole_reply_is_reasoning(server, offline_text):
    assert offline_text  # a reply with text, so the split below is tested
    r = _chat(server)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert (msg["reasoning"], msg["content"]) == (offline_text, None)
    body = {"model": "tiny", "messages": MSGS, "max_tokens": 12, "temperature": 0.0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", server.url_for("v1", "chat", "completions"), json=body,
                      headers=AUTH, timeout=120) as s:  # fmt: skip
        lines = [x[len("data: ") :] for x in s.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    usage = json.loads(lines[-2])  # forced: no stream_options in the request
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    deltas = [json.loads(x)["choices"][0]["delta"] for x in lines[:-2]]
    assert "".join(d.get("reasoning", "") for d in deltas) == offline_text
    assert "".join(d.get("content", "") for d in deltas) == ""  # the role chunk's "" only
    dropped = _chat(server, include_reasoning=False).json()["choices"][0]["message"]
    assert (dropped["reasoning"], dropped["content"]) == (None, None)

    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url_for("v1", "completions"), json=body, headers=AUTH,
                      timeout=120) as s:  # fmt: skip
        lines = [x[len("data: ") :] for x in s.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]" and json.loads(lines[-2])["usage"]["completion_tokens"] == 3
    assert httpx.get(server.url_for("load"), timeout=30).json() == {"server_load": 0}


def test_middleware_wraps_every_response(server):
    for r in (_chat(server), httpx.get(server.url_for("v1", "models"), timeout=30)):
        assert r.headers["x-stamp"] == "class" and r.headers["x-stamp-fn"] == "function"
    assert r.status_code == 401  # the models list without the key: stamped too


def test_responses_api_reasoning_item(server, offline_text):
    """POST /v1/responses through the OpenAI client: the reply is one reasoning item whose
    text is LLM.chat's, ``incomplete`` at max_output_tokens; streamed, the reasoning deltas
    join to it and the last event is response.incomplete."""
    client = server.get_client(api_key="k")
    common = dict(model="tiny", input=MSGS, max_output_tokens=12, temperature=0.0,
                  extra_body={"ignore_eos": True})  # fmt: skip
    resp = client.responses.create(**common)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    [item] = resp.output
    assert item.type == "reasoning" and item.content[0].text == offline_text
    assert resp.usage.output_tokens == 12 and resp.output_text == ""
    events = list(client.responses.create(**common, stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == offline_text
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].content[0].text == offline_text


def test_pythonic_tool_calls(server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
    regex = r'\[get_weather\(city="Paris", days=3\), get_weather\(city="Lyon", days=1\)\]'
    r = _chat(server, tools=tools, guided_regex=regex, max_tokens=40, ignore_eos=False)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in choice["message"]["tool_calls"]]  # fmt: skip
    assert calls == [("get_weather", {"city": "Paris", "days": 3}),
                     ("get_weather", {"city": "Lyon", "days": 1})]  # fmt: skip
    assert choice["message"]["content"] is None and choice["message"]["reasoning"] is None
