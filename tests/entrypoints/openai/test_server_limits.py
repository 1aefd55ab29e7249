"""`vllm serve` refuses what it cannot serve, quickly and in OpenAI's error shape (tiny
Llama on CPU, one server for the module, loopback only).

Guards: requests the scheduler could never run answered 200 with empty choices (now 400
naming the limit, before anything is queued, and ValueError offline); a multi-megabyte
prompt tokenized on the event loop froze /health and other clients' streams; a lone
surrogate gave 500; malformed or deeply nested JSON gave a non-OpenAI body; an oversized
max_tokens named "prompt"; an image part in chat was silently dropped.
"""

import json
import os
import re
import threading
import time

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_server_limits")

MAX_LEN = 256
LIMITS = ["--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", "512"]
LIMITS += ["--max-num-seqs", "8"]
BODY_LIMIT = 16 * 1024 * 1024  # the documented default of --max-request-body-bytes


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    srv = RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", *LIMITS])
    try:
        yield srv
    finally:
        srv.stop()


def _post(server, path: str, body, timeout: float = 60) -> httpx.Response:
    """POST ``body`` (a dict, JSON-encoded with ASCII escapes so lone surrogates survive,
    or raw bytes)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    return httpx.post(server.url_for("v1", path), content=content, headers=headers, timeout=timeout)


def _metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url_for("metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = re.sub(r',?model_name="[^"]*"', "", name).replace("{,", "{")
            out[name.replace("{}", "")] = float(value)
    return out


def _error(r: httpx.Response, status: int, param, *words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param, err
    for w in words:
        assert w in err["message"], err
    return err


@pytest.mark.forked
def test_offline_add_request_refuses_unschedulable(tiny_llama_dir):
    """LLM.generate / LLMEngine.add_request raise ValueError at add time (first in the
    module: a forked test must not inherit the module server's log file)."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        tiny_llama_dir,
        device="cpu",
        max_model_len=MAX_LEN,
        max_num_batched_tokens=512,
        max_num_seqs=8,
        num_gpu_blocks_override=21,
        block_size=16,
    )
    # n x prompt tokens: prompt logprobs read no cache, so the 3 sequences share nothing
    many = SamplingParams(n=3, max_tokens=2, prompt_logprobs=1)
    with pytest.raises(ValueError, match=r"600 tokens .*max_num_batched_tokens=512"):
        llm.generate({"prompt_token_ids": [28] * 200}, many)
    with pytest.raises(ValueError, match=r"9 sequences are more than max_num_seqs=8"):
        llm.llm_engine.add_request("a", [28] * 4, SamplingParams(n=9, max_tokens=2))
    # 2 x 170 tokens reading no cache (prompt logprobs): 22 blocks of 16 > the 21 there are
    alone = SamplingParams(n=2, max_tokens=2, prompt_logprobs=1)
    with pytest.raises(ValueError, match=r"blocks \(22\) than the 21 blocks of 16"):
        llm.llm_engine.add_request("b", [28] * 170, alone)
    assert not llm.llm_engine.has_unfinished_requests()
    # the same two sequences sharing the prompt's 10 full blocks take 12: they run
    two = llm.generate([[28] * 170], SamplingParams(n=2, max_tokens=2, ignore_eos=True),
                       use_tqdm=False)  # fmt: skip
    assert [len(o.token_ids) for o in two[0].outputs] == [2, 2]
    # n > 1 is checked at its longest too (the scheduler preempts and recomputes a group
    # whole, so a group that could outgrow the cache together is refused, not cut short):
    # 4 x (100 + 100) tokens take 13 + 3 x 7 = 34 blocks (6 shared prompt blocks) > 21
    with pytest.raises(
        ValueError,
        match=r"n=4 sequences may grow to 200 tokens each "
        r"\(prompt of 100 \+ max_tokens\), which takes 34 "
        r"KV-cache blocks, more than the 21 blocks",
    ):
        llm.generate({"prompt_token_ids": [28] * 100}, SamplingParams(n=4, max_tokens=100))
    # 4 x (20 + 60) take 5 + 3 x 4 = 17 blocks: admitted; beside two 150-token prompts it
    # is preempted and recomputed, and every sequence still gets all its tokens
    group = SamplingParams(n=4, max_tokens=60, ignore_eos=True, temperature=0.0)
    single = SamplingParams(max_tokens=20, ignore_eos=True)
    outs = llm.generate([[28] * 20, [29] * 150, [30] * 150], [group, single, single],
                        use_tqdm=False)  # fmt: skip
    assert [len(o.token_ids) for o in outs[0].outputs] == [60] * 4
    assert len({tuple(o.token_ids) for o in outs[0].outputs}) == 1  # greedy siblings
    assert [len(o.outputs[0].token_ids) for o in outs[1:]] == [20, 20]
    assert sum(s.num_cumulative_preemption for s in llm.llm_engine.schedulers) > 0
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate([[28] * 150], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize(
    "path,body,param,words",
    [
        # 3 x 200 prompt tokens > max_num_batched_tokens (prompt logprobs: nothing shared)
        (
            "completions",
            {"prompt": [28] * 200, "n": 3, "prompt_logprobs": 1},
            "prompt",
            ["600", "512", "batched"],
        ),
        # a batch: the second prompt cannot run, so the first must not be queued either
        (
            "completions",
            {"prompt": [[28] * 5, [28] * 200], "n": 3, "prompt_logprobs": 1},
            "prompt",
            ["600"],
        ),
        ("completions", {"prompt": "Hi", "n": 9}, "n", ["9", "max_num_seqs=8"]),
        # a priority under the default fcfs policy
        ("completions", {"prompt": "Hi", "priority": 1}, "priority", ["--scheduling-policy"]),
        ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 9}, "n", []),
    ],
)
def test_unschedulable_request_is_400_before_queueing(server, path, body, param, words):
    before = _metrics(server)
    r = _post(server, path, {**body, "max_tokens": 2, "temperature": 0.8})
    _error(r, 400, param, *words)
    after = _metrics(server)
    for name in ("vllm:prompt_tokens_total", "vllm:num_requests_waiting"):
        assert after[name] == before[name], name
    ok = _post(server, "completions", {"prompt": [28] * 100, "n": 5, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 5
    # with prefix caching the n sequences share the prompt's blocks: 200 + 2 x 8 tokens
    ok = _post(server, "completions", {"prompt": [28] * 200, "n": 3, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 3


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("completions", {"prompt": "abc\ud800def", "max_tokens": 2}, "prompt"),
        ("completions", {"prompt": ["ok", "abc\udc00"], "max_tokens": 2}, "prompt"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "abc\ud800def"}], "max_tokens": 2},
            "messages[0].content",
        ),
    ],
)
def test_lone_surrogate_is_400(server, path, body, param):
    _error(_post(server, path, body), 400, param, "surrogate", "U+D")


def test_bad_json_and_fields_answer_openai_errors(server):
    err = _error(_post(server, "completions", b'{"prompt": "hi", "max_tokens": }'), 400, None)
    assert err["message"] == "The request body is not valid JSON: Expecting value at character 31."
    nested = b'{"prompt": ' + b"[" * 10000 + b"]" * 10000 + b"}"
    _error(_post(server, "completions", nested), 400, None, "nested too deeply")
    _error(_post(server, "completions", b"[" * 10000 + b"]" * 10000), 400, None, "nested")
    r = _post(server, "completions", {"prompt": "hi", "max_tokens": 10**9})
    _error(r, 400, "max_tokens", str(10**9), str(MAX_LEN))
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]
    r = _post(server, "chat/completions", {"messages": msgs, "max_tokens": 2})
    _error(r, 400, "messages.0.content.1.type", "'image_url'", "text only")


def test_body_size_limit_is_413(server):
    body = json.dumps({"prompt": "a" * (BODY_LIMIT + 10), "max_tokens": 2}).encode()
    _error(_post(server, "completions", body), 413, None, str(BODY_LIMIT), "max-request-body")

    def chunks():  # no Content-Length: counted while received
        for i in range(0, len(body), 1 << 20):
            yield body[i : i + (1 << 20)]

    r = httpx.post(server.url_for("v1", "completions"), content=chunks(), timeout=60)
    _error(r, 413, None, str(BODY_LIMIT))


def test_large_prompt_does_not_stall_health_or_other_streams(server):
    """A 15 MB prompt (tokenizing it takes tens of seconds on a busy CPU) while another
    client streams: its 400 comes without tokenizing it, /health answers within 1 s
    throughout, and the stream never waits more than 3 s between chunks (a step of the
    tiny model takes milliseconds; the bound leaves room for a busy machine)."""
    big = json.dumps({"prompt": "hello world " * 1_250_000, "max_tokens": 2}).encode()
    assert len(big) < BODY_LIMIT
    stamps, health, result = [], [], {}
    started, big_done = threading.Event(), threading.Event()

    def stream():
        body = {"prompt": "Once upon a time", "max_tokens": 240, "stream": True}
        body |= {"ignore_eos": True, "temperature": 0}
        with httpx.stream("POST", server.url_for("v1", "completions"), json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.monotonic())
                    started.set()

    def send_big():
        t0 = time.monotonic()
        result["resp"] = _post(server, "completions", big, timeout=120)
        result["seconds"] = time.monotonic() - t0
        big_done.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(60)
    sender = threading.Thread(target=send_big)
    sender.start()
    while not big_done.is_set():
        t0 = time.monotonic()
        code = httpx.get(server.url_for("health"), timeout=30).status_code
        health.append((code, time.monotonic() - t0))
        time.sleep(0.05)
    sender.join()
    streamer.join(120)
    assert health and all(code == 200 for code, _ in health), health
    assert max(s for _, s in health) < 1.0, (health, result["seconds"])
    assert len(stamps) == 240
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert max(gaps) < 3.0, (max(gaps), result["seconds"])
    _error(result["resp"], 400, "prompt", "15000000 characters", str(MAX_LEN))


def test_model_served_under_the_given_path_and_its_short_name(server, tiny_llama_dir):
    """Without --served-model-name the model answers to the exact path given to `vllm serve`
    (upstream's name, listed first and reported when ``model`` is omitted) and to its short
    name. Guards: the given path answered 404 (only the short name was served)."""
    short = os.path.basename(os.path.normpath(tiny_llama_dir))
    cards = httpx.get(server.url_for("v1", "models"), timeout=30).json()["data"]
    assert [c["id"] for c in cards] == [tiny_llama_dir, short]
    base = {"prompt": "hi", "max_tokens": 1}
    for name in (tiny_llama_dir, short):
        r = _post(server, "completions", {**base, "model": name})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == name
    assert _post(server, "completions", base).json()["model"] == tiny_llama_dir
    err = _error(_post(server, "completions", {**base, "model": "other"}), 404, "model")
    assert f"`{tiny_llama_dir}`, `{short}`" in err["message"]
