"""`vllm serve --enable-prefix-caching`: /metrics shows the prefix-cache hit rate after two
requests sharing a prefix, and POST /reset_prefix_cache empties the cache (tiny Llama, CPU)."""

import os
import re

import httpx
import pytest

from tests.utils import RemoteOpenAIServer

SHARED = list(range(20, 20 + 48))  # 3 blocks of 16 tokens


def _metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url_for("metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", name)] = float(value)
    return out


def _complete(server, model, tokens):
    """One greedy completion of ``tokens``; ``model`` is the checkpoint path, served under
    its short name (the directory's last component)."""
    name = os.path.basename(model.rstrip("/"))
    body = {"model": name, "prompt": tokens, "max_tokens": 4, "temperature": 0}
    r = httpx.post(server.url_for("v1", "completions"), json=body, timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.forked
def test_metrics_show_hit_rate_and_reset_empties_the_cache(tiny_llama_dir):
    srv = RemoteOpenAIServer(
        tiny_llama_dir, ["--device", "cpu", "--block-size", "16", "--enable-prefix-caching"]
    )
    try:
        _complete(srv, tiny_llama_dir, SHARED + [300, 301, 302])
        before = _metrics(srv)
        assert before["vllm:gpu_prefix_cache_hits_total"] == 0
        assert before["vllm:gpu_prefix_cache_queries_total"] == 51
        _complete(srv, tiny_llama_dir, SHARED + [400, 401])
        m = _metrics(srv)
        assert m["vllm:gpu_prefix_cache_queries_total"] == 51 + 50
        assert m["vllm:gpu_prefix_cache_hits_total"] == 48
        assert m["vllm:gpu_prefix_cache_hit_rate"] == pytest.approx(48 / 101)
        r = httpx.post(srv.url_for("reset_prefix_cache"), timeout=30)
        assert r.status_code == 200
        _complete(srv, tiny_llama_dir, SHARED + [500])
        m = _metrics(srv)
        assert m["vllm:gpu_prefix_cache_hits_total"] == 48  # nothing found after the reset
        assert m["vllm:gpu_prefix_cache_queries_total"] == 101 + 49
    finally:
        srv.stop()
