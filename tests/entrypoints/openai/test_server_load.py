"""Load and fault test of `vllm serve` (tiny Llama on CPU, loopback only): 256 streaming
requests from 64 concurrent clients, a quarter of them dropped by their client midway.

Guards: a completed stream must equal its non-streamed greedy result (CPU float32: exact,
docs/design.md "Comparisons"), aborted requests must free everything (running, waiting and
KV usage back to zero), and no request may be lost: length-finished + aborted = sent, counted by the
server's own /metrics (request_success_total by finished_reason).
"""

import asyncio
import json
import re
import time

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

NUM_REQUESTS, CONCURRENCY, MAX_TOKENS = 256, 64, 12
# A dropped request asks for as many tokens as the model length allows, so its client
# leaves long before the server could finish it, unless it is starved of CPU (allowed for
# below, a few at most).
MAX_MODEL_LEN, DROPPED_MAX_TOKENS = 512, 480
ABORTED = {i for i in range(NUM_REQUESTS) if i % 4 == 3}
PROMPTS = [f"Load test request number {i}:" for i in range(NUM_REQUESTS)]


def _metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url_for("metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = re.sub(r',?model_name="[^"]*"', "", name).replace("{,", "{")
            out[name.replace("{}", "")] = float(value)
    return out


async def _one(client: httpx.AsyncClient, url: str, i: int, gate: asyncio.Semaphore):
    """Stream request ``i``: (text, finish_reason), or ("aborted", chunks read) when the
    client drops it after two chunks of its DROPPED_MAX_TOKENS."""
    drop = i in ABORTED
    body = {"prompt": PROMPTS[i], "max_tokens": DROPPED_MAX_TOKENS if drop else MAX_TOKENS}
    body["stream"] = True
    body |= {"temperature": 0, "ignore_eos": True}
    text, finish, chunks = "", None, 0
    async with gate, client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            chunks += 1
            if drop and chunks == 2:
                return "aborted", chunks  # leaving the block closes the connection
    return text, finish


@pytest.mark.forked
def test_64_clients_256_streams_with_a_quarter_dropped(tiny_llama_dir):
    server = RemoteOpenAIServer(
        tiny_llama_dir, ["--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN)]
    )
    try:
        url = server.url_for("v1", "completions")
        kept = [i for i in range(NUM_REQUESTS) if i not in ABORTED]
        body = {"prompt": [PROMPTS[i] for i in kept], "max_tokens": MAX_TOKENS, "logprobs": 0}
        body |= {"temperature": 0, "ignore_eos": True}
        ref = httpx.post(url, json=body, timeout=300).json()["choices"]
        ref = {kept[c["index"]]: c for c in ref}
        for c in ref.values():  # greedy equality means something only on varied outputs
            assert len(set(c["logprobs"]["tokens"])) >= 3, c["logprobs"]["tokens"]
        before = _metrics(server)

        async def run():
            gate = asyncio.Semaphore(CONCURRENCY)
            limits = httpx.Limits(max_connections=CONCURRENCY)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                jobs = [_one(client, url, i, gate) for i in range(NUM_REQUESTS)]
                return await asyncio.gather(*jobs)

        t0 = time.monotonic()
        results = asyncio.run(run())
        elapsed = time.monotonic() - t0
        for i, (text, finish) in enumerate(results):
            if i in ABORTED:
                assert (text, finish) == ("aborted", 2)
            else:
                assert (text, finish) == (ref[i]["text"], "length"), (i, elapsed)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = _metrics(server)
            idle = m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
            if idle and m["vllm:gpu_cache_usage_perc"] == 0:
                break
            time.sleep(0.2)
        assert m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0, m
        assert m["vllm:gpu_cache_usage_perc"] == 0, m

        def done(reason):
            key = f'vllm:request_success_total{{finished_reason="{reason}"}}'
            return m.get(key, 0) - before.get(key, 0)

        # A dropped request that the server finished before its client read two chunks
        # (a client starved of CPU reads late) counts as "length"; allow a few.
        late = done("length") - (NUM_REQUESTS - len(ABORTED))
        assert 0 <= late <= len(ABORTED) // 8, (done("length"), done("abort"))
        assert done("abort") == len(ABORTED) - late
        assert done("length") + done("abort") + done("stop") == NUM_REQUESTS
    finally:
        server.stop()
