"""`vllm serve` end to end on CPU with SmolLM2: one server per module (started once, killed
at the end), driven by the official openai client and raw httpx.

Covers: greedy completions/chat equal to LLM.generate / LLM.chat (run in a forked child),
usage, n=2, seeds, streaming (one chunk per token, the first before the end), echo and
logprobs, max_tokens null, every bad request -> 400/401/404 with the engine healthy after,
64 concurrent streams counted by /metrics, client disconnect -> abort + blocks freed, a
fault injected by the test's launcher (fault_server.py) -> 500 while the server survives
(its traceback logged: --log-error-stack), outputs in the request log
(--enable-log-outputs), and SIGTERM -> in-flight request finishes and the process exits 0
(the last test).
"""

import asyncio
import json
import os
import re
import threading
import time

import httpx
import openai
import pytest

from tests.utils import RemoteOpenAIServer, run_in_fork

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts and its reference engine runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_server")

MODEL = "smollm2"
KEY = "test-key"
FAULT_SERVER = os.path.join(os.path.dirname(__file__), "fault_server.py")
FAULT = "FAULT-INJECT-7f3a"  # fault_server.py fails the requests whose prompt contains it
PROMPTS = ["The capital of France is", "Hello, my name is", "def fibonacci(n):"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
MAX_LEN = 512
SHUTDOWN_TIMEOUT = 600


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    args = ["--device", "cpu", "--max-model-len", str(MAX_LEN)]
    args += ["--served-model-name", MODEL, "--api-key", KEY, "--max-log-len", "40"]
    args += ["--enable-log-outputs", "--log-error-stack"]
    args += ["--root-path", "/pfx"]  # the key guards the prefixed routes too
    # generous: the SIGTERM test's drain must not depend on how fast this machine generates
    args += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
    srv = RemoteOpenAIServer(smollm2_gguf, args, launcher=FAULT_SERVER)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.get_client(api_key=KEY)


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """Greedy LLM.generate / LLM.chat outputs, computed in a forked child process."""

    def run():
        from vllm import LLM, SamplingParams

        llm = LLM(smollm2_gguf, device="cpu", max_model_len=MAX_LEN)
        sp = SamplingParams(temperature=0.0, max_tokens=8)
        gen = llm.generate(PROMPTS, sp, use_tqdm=False)
        chat = llm.chat(CHAT, sp, use_tqdm=False)[0]
        return {
            "text": [o.outputs[0].text for o in gen],
            "ntok": [len(o.outputs[0].token_ids) for o in gen],
            "nprompt": [len(o.prompt_token_ids) for o in gen],
            "ids": [list(o.prompt_token_ids) for o in gen],
            "chat": chat.outputs[0].text,
            "chat_prompt": len(chat.prompt_token_ids),
            "chat_ntok": len(chat.outputs[0].token_ids),
        }

    return run_in_fork(run)


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.url_for("metrics"), timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        if "{" in name:  # drop the model_name label, keep the others in order
            base, labels = name[:-1].split("{", 1)
            kept = [
                kv for kv in re.findall(r'\w+="[^"]*"', labels) if kv.split("=")[0] != "model_name"
            ]
            name = base + ("{" + ",".join(kept) + "}" if kept else "")
        out[name] = float(value)
    return out


def test_models_health_version_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    card = client.models.list().data[0].model_dump()
    assert card["parent"] is None and card["permission"][0]["object"] == "model_permission"
    assert httpx.get(server.url_for("health")).status_code == 200
    assert httpx.get(server.url_for("ping")).status_code == 200  # upstream's alias
    assert httpx.post(server.url_for("ping")).status_code == 200
    schema = httpx.get(server.url_for("openapi.json"), timeout=60).json()
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) and "health_ping_post" in ids  # one id per route
    assert httpx.get(server.url_for("version")).json()["version"]
    # development and profiler routes exist only with VLLM_SERVER_DEV_MODE /
    # VLLM_TORCH_PROFILER_DIR (as upstream)
    for route in ("reset_prefix_cache", "start_profile", "stop_profile"):
        assert httpx.post(server.url_for(route)).status_code == 404, route
    text = httpx.get(server.url_for("metrics")).text
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:decode_steps",
    ]:
        assert name in text, name
    for name in ("num_requests_swapped", "cpu_cache_usage_perc", "cpu_prefix_cache_hit_rate"):
        assert f'vllm:{name}{{model_name="{MODEL}"}} 0.0' in text, name  # V0's, always 0


def test_root_path_without_deprecation_warning(server):
    """--root-path serves the routes under the prefix too, and start-up logs no warning.

    Guards: every start with --root-path logged FastAPI's "The `root_path` parameter is
    deprecated" warning with a line of this server's source."""
    assert httpx.get(server.url_for("pfx", "health"), timeout=10).status_code == 200
    assert "root_path` parameter is deprecated" not in server.read_log()


def test_greedy_equals_llm_generate(client, reference):
    for i, p in enumerate(PROMPTS[:1]):
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
        assert r.choices[0].text == reference["text"][i], p
        assert r.usage.prompt_tokens == reference["nprompt"][i]
        assert r.usage.completion_tokens == reference["ntok"][i]
        assert r.usage.total_tokens == reference["nprompt"][i] + reference["ntok"][i]
    # a batch of prompts, one of them as token ids
    batch = [PROMPTS[0], reference["ids"][1], PROMPTS[2]]
    r = client.completions.create(model=MODEL, prompt=batch, max_tokens=8, temperature=0)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == reference["text"]
    assert r.usage.prompt_tokens == sum(reference["nprompt"])
    assert r.usage.completion_tokens == sum(reference["ntok"])
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == reference["chat"]
    assert chat.usage.prompt_tokens == reference["chat_prompt"]
    assert chat.usage.completion_tokens == reference["chat_ntok"]


def test_n2_and_seeds(client):
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=4, temperature=1.0, n=2)
    a = client.completions.create(seed=1234, extra_body={"ignore_eos": True}, **kw)
    b = client.completions.create(seed=1234, extra_body={"ignore_eos": True}, **kw)
    assert sorted(c.index for c in a.choices) == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 8
    msgs = dict(model=MODEL, messages=CHAT, max_tokens=4, temperature=1.0, seed=7)
    c1 = client.chat.completions.create(**msgs)
    c2 = client.chat.completions.create(**msgs)
    assert c1.choices[0].message.content == c2.choices[0].message.content


def test_streaming_one_chunk_per_token(client, reference):
    start = time.perf_counter()
    stamps, texts, usage, finish = [], [], None, None
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices:
            stamps.append(time.perf_counter() - start)
            texts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(texts) == reference["ntok"][0] == usage.completion_tokens
    assert "".join(texts) == reference["text"][0]
    assert finish == "length"
    assert stamps[0] < 0.75 * stamps[-1], stamps  # tokens arrive as they are generated

    pieces, roles = [], []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, temperature=0, stream=True
    ):
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
            assert d.content == "" and d.tool_calls is None
        elif d.content is not None:
            pieces.append(d.content)
    assert roles == ["assistant"]
    assert len(pieces) == reference["chat_ntok"]
    assert "".join(pieces) == reference["chat"]


def test_echo_logprobs_stop_and_rest_of_context(client):
    p = PROMPTS[0]
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == p and r.usage.completion_tokens == 0
    assert len(lp.tokens) == r.usage.prompt_tokens == 5
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=3, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 3 and "".join(lp.tokens) == r.choices[0].text
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert chosen == pytest.approx(max(top.values())) and top[tok] == chosen
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=3, echo=True, temperature=0)
    assert r.choices[0].text.startswith(p) and len(r.choices[0].text) > len(p)
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0, stop=["."])
    assert r.choices[0].text == " Paris" and r.choices[0].finish_reason == "stop"
    # Streamed with a stop string that starts inside " Paris": the "s" is held back until
    # the "." shows it to be the stop string, so the pieces join to the final text.
    kw = dict(model=MODEL, prompt=p, max_tokens=10, temperature=0, stop=["s."])
    final = client.completions.create(**kw).choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **kw)]
    assert final == " Pari" and "".join(pieces) == final, pieces
    # Streamed echo with logprobs: text_offset runs on over the prompt and every chunk.
    chunks = list(client.completions.create(model=MODEL, prompt=p, max_tokens=3, temperature=0,
                                            echo=True, logprobs=1, stream=True))  # fmt: skip
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert len(chunks) > 2 and len(tokens) == 5 + 3
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert "".join(tokens) == "".join(c.choices[0].text for c in chunks)
    # max_tokens null: the rest of the context (prompt of 505 tokens -> at most 7 more)
    long_ids = [28] * 505
    r = client.completions.create(
        model=MODEL,
        prompt=long_ids,
        max_tokens=None,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.usage.prompt_tokens == 505 and r.usage.total_tokens == MAX_LEN
    assert r.choices[0].finish_reason == "length"


def test_stop_string_cutting_held_back_tokens_keeps_the_engine_alive(server, client):
    """A stop string that ends inside a token whose text the detokenizer held back (an
    incomplete UTF-8 character) cuts the tokens after it, tokens an earlier step appended.
    Usage counts every generated token, the cut ones included, streamed or not, for
    completions and chat alike.

    Guards: the step's generated-token count went negative, the Prometheus counter
    raised, and the engine loop died (503 for this request, then the server exited); a
    streamed usage counted the cut tokens already streamed (8) and the response not
    streamed none of them (7)."""
    prompt = " ".join(["🦙🥑"] * 8)  # greedy continues " 🦙🥑 🦙..." (" ðŁ" holds " ")
    before = _metrics(server)["vllm:generation_tokens_total"]
    common = dict(model=MODEL, max_tokens=9, temperature=0, stop=["🥑 "])
    usage = {}
    for stream in (False, True):
        kw = dict(prompt=prompt, **common)
        if stream:
            chunks = list(
                client.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kw
                )  # fmt: skip
            )
            usage["cmpl", stream] = chunks.pop().usage
            text = "".join(c.choices[0].text for c in chunks)
            finish = chunks[-1].choices[0]
        else:
            resp = client.completions.create(**kw)
            finish, usage["cmpl", stream] = resp.choices[0], resp.usage
            text = finish.text
        assert text == " 🦙" and finish.finish_reason == "stop", (stream, text)
        assert finish.stop_reason == "🥑 "
    messages = [{"role": "user", "content": "Repeat: " + prompt}]  # the reply is cut too
    reply = client.chat.completions.create(messages=messages, **common)
    usage["chat", False] = reply.usage
    chunks = list(
        client.chat.completions.create(messages=messages, stream=True,
                                       stream_options={"include_usage": True}, **common)
    )  # fmt: skip
    usage["chat", True] = chunks[-1].usage
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    assert httpx.get(server.url_for("health"), timeout=10).status_code == 200
    # every token sampled counts once, those cut off included (9 per request here)
    assert _metrics(server)["vllm:generation_tokens_total"] - before == 4 * 9
    assert usage["cmpl", True] == usage["cmpl", False], usage
    assert usage["chat", True] == usage["chat", False], usage
    for (api, stream), u in usage.items():
        assert u.completion_tokens == 9 and u.total_tokens == u.prompt_tokens + 9, (api, stream)


def test_tokenize_and_detokenize(server, client):
    """/tokenize gives the ids /v1/completions counts as prompt tokens (text, and chat
    messages rendered with the template); /detokenize inverts it; bad bodies get 400."""
    url = server.url_for
    p = PROMPTS[0]
    r = httpx.post(url("tokenize"), json={"model": MODEL, "prompt": p}, timeout=60).json()
    usage = client.completions.create(model=MODEL, prompt=p, max_tokens=1).usage
    assert r["count"] == len(r["tokens"]) == usage.prompt_tokens and r["max_model_len"] == MAX_LEN
    back = httpx.post(url("detokenize"), json={"model": MODEL, "tokens": r["tokens"]}, timeout=60)
    assert back.json()["prompt"].endswith(p)
    assert r["token_strs"] is None
    body = {"model": MODEL, "prompt": "Hello world", "return_token_strs": True}
    strs = httpx.post(url("tokenize"), json=body, timeout=60).json()
    assert strs["token_strs"] == ["Hello", "Ġworld"]  # the tokenizer's own token strings
    r = httpx.post(url("tokenize"), json={"model": MODEL, "messages": CHAT}, timeout=60).json()
    usage = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1).usage
    assert r["count"] == usage.prompt_tokens
    for path, body, words in [
        ("tokenize", {"model": MODEL}, "exactly one of prompt and messages"),
        ("tokenize", {"model": MODEL, "prompt": p, "messages": CHAT}, "exactly one"),
        ("detokenize", {"model": MODEL, "tokens": [10**9]}, "out of vocabulary"),
    ]:
        bad = httpx.post(url(path), json=body, timeout=60)
        assert bad.status_code == 400 and words in bad.json()["error"]["message"], bad.text
    assert httpx.post(url("tokenize"), json={"model": "nope", "prompt": p}).status_code == 404


def _bad(server, path, body, key=KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers["Content-Type"] = "application/json"
    content = json.dumps(body)  # as Python writes it: Infinity and NaN as such
    return httpx.post(server.url_for("v1", path), content=content, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "path,body,status,words",
    [
        ("completions", {"model": MODEL, "prompt": ""}, 400, ["prompt", "empty"]),
        ("completions", {"model": MODEL, "prompt": []}, 400, ["prompt", "empty"]),
        ("chat/completions", {"model": MODEL, "messages": []}, 400, ["messages", "empty"]),
        ("completions", {"model": MODEL, "prompt": [28] * 600}, 400, ["512", "600", "616"]),
        ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 600}, 400, ["512", "601"]),
        ("chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 600}, 400, ["512"]),
        (
            "completions",
            {"model": MODEL, "prompt": "hi", "max_tokens": -1},
            400,
            ["max_tokens must be at least 1 (0 is allowed with echo=true), got -1"],
        ),
        ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, ["max_tokens"]),
        (
            "chat/completions",
            {"model": MODEL, "messages": CHAT, "max_tokens": 0},
            400,
            ["max_tokens must be at least 1, got 0."],
        ),
        ("completions", {"model": MODEL, "prompt": "hi", "temperature": -1}, 400, ["temperature"]),
        ("completions", {"model": MODEL, "prompt": "hi", "top_p": 2}, 400, ["top_p"]),
        ("completions", {"model": MODEL, "prompt": "hi", "n": 0}, 400, ["n must"]),
        ("completions", {"model": MODEL, "prompt": [10**9]}, 400, ["vocabulary"]),
        ("completions", {"model": MODEL, "prompt": "hi", "seed": 2**64}, 400, ["seed", "64-bit"]),
        ("completions", {"model": MODEL, "prompt": "hi", "n": 2**63}, 400, ["max_num_seqs"]),
        ("completions", {"model": MODEL, "prompt": "hi", "logprobs": 21}, 400, ["max_logprobs=20"]),
        ("completions", {"model": MODEL, "prompt": "hi", "n": 3, "best_of": 2}, 400, ["best_of"]),
        (
            "chat/completions",
            {"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 21},
            400,
            ["max_logprobs=20"],
        ),
        (
            "chat/completions",
            {"model": MODEL, "messages": CHAT, "top_logprobs": 2},
            400,
            ["top_logprobs=2 needs logprobs=true"],
        ),
        ("completions", {"model": MODEL}, 400, ["prompt"]),
        (
            "completions",
            {"model": MODEL, "prompt": "hi", "temperature": float("inf")},
            400,
            ["temperature must be a finite number, got inf"],
        ),
        (
            "chat/completions",
            {
                "model": MODEL,
                "messages": CHAT,
                "use_beam_search": True,
                "n": 2,
                "length_penalty": float("nan"),
            },
            400,
            ["length_penalty", "nan"],
        ),
        ("completions", {"model": "nope", "prompt": "hi"}, 404, ["nope"]),
        ("chat/completions", {"model": "nope", "messages": CHAT}, 404, ["nope"]),
    ],
)
def test_bad_request(server, client, path, body, status, words):
    r = _bad(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status
    assert err["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
    for w in words:
        assert w in err["message"], err
    field = {"seed": "seed", "logprobs": "logprobs", "best_of": "best_of", "top_logprobs":
             "top_logprobs"}  # fmt: skip
    for key, name in field.items():
        if key in body and not (key == "logprobs" and path.startswith("chat")):
            assert err["param"] == name, err
    ok = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2
    assert httpx.get(server.url_for("health")).status_code == 200


def test_api_key(server):
    for key in (None, "wrong"):
        r = _bad(server, "completions", {"model": MODEL, "prompt": "hi"}, key=key)
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
    with pytest.raises(openai.AuthenticationError):
        server.get_client(api_key="wrong").models.list()
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for path in ("pfx/v1/completions", "v1/completions"):  # with and without --root-path
        for key in (None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = httpx.post(server.url_for(path), json=body, headers=headers, timeout=60)
            assert r.status_code == 401, (path, key, r.text)
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.post(server.url_for(path), json=body, headers=auth, timeout=60).is_success
    assert httpx.get(server.url_for("pfx", "health")).status_code == 200  # not under /v1
    rerank = {"query": "a", "documents": ["b"]}  # /v2 is guarded too, as upstream
    assert httpx.post(server.url_for("v2", "rerank"), json=rerank, timeout=60).status_code == 401


def test_invocations_dispatches_on_the_body(server, reference):
    """SageMaker's /invocations: `prompt` is a completion, `messages` a chat completion,
    each equal to LLM.generate / LLM.chat; the API key guards it; a body with neither, or
    a bad field, is a 400 that says so."""
    url, auth = server.url_for("invocations"), {"Authorization": f"Bearer {KEY}"}
    greedy = {"max_tokens": 8, "temperature": 0}
    r = httpx.post(url, json={"prompt": PROMPTS[0], **greedy}, headers=auth, timeout=120)
    assert r.status_code == 200 and r.json()["object"] == "text_completion", r.text
    assert r.json()["choices"][0]["text"] == reference["text"][0]
    r = httpx.post(url, json={"messages": CHAT, **greedy}, headers=auth, timeout=120)
    assert r.json()["object"] == "chat.completion", r.text
    assert r.json()["choices"][0]["message"]["content"] == reference["chat"]
    assert httpx.post(url, json={"prompt": "hi"}, timeout=60).status_code == 401
    r = httpx.post(url, json={"input": "hi"}, headers=auth, timeout=60)
    assert r.status_code == 400 and "`messages`" in r.json()["error"]["message"], r.text
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": "x"}, headers=auth, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_64_concurrent_streams_counted_by_metrics(server):
    before = _metrics(server)

    async def one(client, i):
        n = 0
        stream = await client.completions.create(
            model=MODEL,
            prompt=f"Count {i}:",
            max_tokens=4,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            n += len(chunk.choices)
        return n

    async def main():
        client = server.get_async_client(api_key=KEY, timeout=120)
        return await asyncio.gather(*[one(client, i) for i in range(64)])

    assert asyncio.run(main()) == [4] * 64
    after = _metrics(server)
    key = 'vllm:request_success_total{finished_reason="length"}'
    assert after[key] - before.get(key, 0) == 64
    gen = "vllm:generation_tokens_total"
    assert after[gen] - before[gen] == 256
    ttft = "vllm:time_to_first_token_seconds_count"
    assert after[ttft] - before[ttft] == 64
    assert after["vllm:num_requests_running"] == 0


def test_disconnect_aborts_and_frees_blocks(server):
    before = _metrics(server)
    body = {"model": MODEL, "prompt": "Tell me a story.", "max_tokens": 400, "stream": True}
    body["ignore_eos"] = True
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url_for("v1", "completions"), json=body, headers=headers) as r:
        # The iterator is held: a dropped one is finalized at once, and closing it closes
        # the connection, which would disconnect the client before the gauge is read.
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                break
        assert '"text"' in line, line  # a token chunk, not an error event
        # The gauge is set before a step's chunks are sent, so it already counts the request.
        assert _metrics(server)["vllm:num_requests_running"] == 1, line
    deadline = time.time() + 20
    while time.time() < deadline:
        m = _metrics(server)
        if m["vllm:num_requests_running"] == 0 and m["vllm:gpu_cache_usage_perc"] == 0:
            break
        time.sleep(0.2)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:gpu_cache_usage_perc"] == 0, m
    gen = "vllm:generation_tokens_total"
    assert m[gen] - before[gen] < 200  # aborted long before its 400 tokens


def test_request_log_shows_outputs(server, client):
    """--enable-log-outputs: each finished request's text and token ids are logged at INFO
    under its engine request id (a stream's once, at its end), cut to --max-log-len."""
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    whole = client.completions.create(extra_headers={"X-Request-Id": "logout-a"}, **kw)
    chunks = list(
        client.completions.create(stream=True, extra_headers={"X-Request-Id": "logout-b"}, **kw)
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, temperature=0,
        extra_headers={"X-Request-Id": "logout-c"},
    )  # fmt: skip
    assert whole.choices[0].finish_reason == reply.choices[0].finish_reason == "length"
    log = server.read_log()
    for rid, text, n in [
        ("cmpl-logout-a-0", whole.choices[0].text, 12),
        ("cmpl-logout-b-0", whole.choices[0].text, 12),
        ("chatcmpl-logout-c", reply.choices[0].message.content, 5),
    ]:
        lines = [ln for ln in log.splitlines() if f"Generated response {rid}:" in ln]
        assert len(lines) == 1, (rid, lines)
        assert f"output: {text[:40]!r}, output_token_ids: [" in lines[0], lines[0]
        shown = lines[0].split("output_token_ids: [", 1)[1].split("]", 1)[0]
        assert len(shown.split(", ")) == n and lines[0].endswith("finish_reason: length.")


def test_fault_hook_fails_one_request_only(server, client):
    log_start = len(server.read_log())

    async def main():
        aclient = server.get_async_client(api_key=KEY)
        bad = aclient.completions.create(model=MODEL, prompt=f"x {FAULT}", max_tokens=4)
        good = aclient.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0
        )
        return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = asyncio.run(main())
    assert isinstance(bad, openai.InternalServerError), bad
    assert good.usage.completion_tokens == 4
    with pytest.raises(openai.APIError):
        for _ in client.completions.create(
            model=MODEL, prompt=f"y {FAULT}", max_tokens=4, stream=True
        ):
            pass
    assert httpx.get(server.url_for("health")).status_code == 200
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    assert _metrics(server)["vllm:gpu_cache_usage_perc"] == 0
    # --log-error-stack: each failed request's traceback, the HTTP 500 unchanged
    log = server.read_log()[log_start:]
    stacks = [m.start() for m in re.finditer(r"ERROR .*Error response \(HTTP 500\)", log)]
    assert len(stacks) == 2, log[-3000:]
    for at in stacks:
        assert log[at:].split("\n", 2)[1] == "Traceback (most recent call last):"


def test_cli_chat_and_complete_clients(server, reference):
    """`vllm complete` and `vllm chat` print the server's greedy replies (equal to
    LLM.generate / LLM.chat), with -q or one line per stdin line; a bad key exits 1 naming
    the HTTP status."""
    import subprocess
    import sys

    url = server.url_for("v1")

    def cli(*args, stdin=None):
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli", *args, "--url", url]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)

    common = ["--api-key", KEY, "--temperature", "0"]
    r = cli("complete", *common, "--max-tokens", "8", "-q", PROMPTS[0])
    assert r.returncode == 0, r.stderr
    assert r.stdout == reference["text"][0] + "\n"
    r = cli("complete", *common, "--max-tokens", "8", stdin=f"{PROMPTS[0]}\n{PROMPTS[1]}\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.replace("> ", "") == f"{reference['text'][0]}\n{reference['text'][1]}\n"
    # chat: max_tokens is the server's open default, so compare the first 8 tokens' text
    r = cli("chat", *common, "-q", CHAT[0]["content"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(reference["chat"]), (r.stdout, reference["chat"])
    r = cli("complete", "--api-key", "wrong", "-q", "x")
    assert r.returncode == 1 and "error: HTTP 401" in r.stderr, r.stderr


def test_sigterm_finishes_in_flight_request_then_exits(server, client):
    """Last test of the module: it stops the shared server."""
    chunks, first = [], threading.Event()

    def consume():
        stream = client.completions.create(
            model=MODEL,
            prompt=PROMPTS[2],
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            chunks.append(chunk)
            first.set()

    t = threading.Thread(target=consume)
    t.start()
    assert first.wait(60)
    assert server.stop(timeout=SHUTDOWN_TIMEOUT + 30) == 0, server.log_tail()
    t.join(60)
    assert len(chunks) == 24 and chunks[-1].choices[0].finish_reason == "length"
    assert "Shutting down the engine" in server.read_log()
