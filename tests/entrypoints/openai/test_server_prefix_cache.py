"""`vllm serve --enable-prefix-caching`: /metrics shows the prefix-cache hit rate after two
requests sharing a prefix, each response's usage.prompt_tokens_details.cached_tokens says
how many of its prompt tokens were found (--enable-prompt-tokens-details),
vllm:prompt_tokens_total counts the cached tokens too (as upstream), POST
/reset_prefix_cache (a development route: VLLM_SERVER_DEV_MODE=1) empties the cache, and
a request's ``cache_salt`` shares blocks only with requests of the same salt (tiny Llama,
CPU)."""

import json
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


def _complete(server, model, tokens, stream=False, **extra) -> int:
    """One greedy completion of ``tokens`` (``extra``: more body fields); ``model`` is the
    checkpoint path, served under its short name (the directory's last component).
    Returns usage's cached_tokens."""
    name = os.path.basename(model.rstrip("/"))
    body = {"model": name, "prompt": tokens, "max_tokens": 4, "temperature": 0, **extra}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    r = httpx.post(server.url_for("v1", "completions"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    if stream:
        last = [x for x in r.text.splitlines() if x.startswith("data: {")][-1]
        return json.loads(last[6:])["usage"]["prompt_tokens_details"]["cached_tokens"]
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.forked
def test_metrics_show_hit_rate_and_reset_empties_the_cache(tiny_llama_dir):
    srv = RemoteOpenAIServer(
        tiny_llama_dir,
        ["--device", "cpu", "--block-size", "16", "--enable-prefix-caching",
         "--enable-prompt-tokens-details"],
        env={"VLLM_SERVER_DEV_MODE": "1"},  # POST /reset_prefix_cache
    )  # fmt: skip
    try:
        assert _complete(srv, tiny_llama_dir, SHARED + [300, 301, 302]) == 0
        before = _metrics(srv)
        assert before["vllm:gpu_prefix_cache_hits_total"] == 0
        assert before["vllm:gpu_prefix_cache_queries_total"] == 51
        assert _complete(srv, tiny_llama_dir, SHARED + [400, 401]) == 48
        m = _metrics(srv)
        assert m["vllm:gpu_prefix_cache_queries_total"] == 51 + 50
        assert m["vllm:gpu_prefix_cache_hits_total"] == 48
        assert m["vllm:gpu_prefix_cache_hit_rate"] == pytest.approx(48 / 101)
        # prompt tokens count whole prompts, the cached part included (as upstream)
        assert m["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 50
        r = httpx.post(srv.url_for("reset_prefix_cache"), timeout=30)
        assert r.status_code == 200
        assert _complete(srv, tiny_llama_dir, SHARED + [500], stream=True) == 0
        m = _metrics(srv)
        assert m["vllm:gpu_prefix_cache_hits_total"] == 48  # nothing found after the reset
        assert m["vllm:gpu_prefix_cache_queries_total"] == 101 + 49
        assert _complete(srv, tiny_llama_dir, SHARED + [600], stream=True) == 48
        # cache_salt: a salted request finds none of the unsalted blocks, nor another
        # salt's; a second request of the same salt finds them (streamed too)
        assert _complete(srv, tiny_llama_dir, SHARED + [700], cache_salt="t1") == 0
        assert _complete(srv, tiny_llama_dir, SHARED + [701], cache_salt="t2") == 0
        assert _complete(srv, tiny_llama_dir, SHARED + [702], True, cache_salt="t1") == 48
        name = os.path.basename(tiny_llama_dir.rstrip("/"))
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2, "cache_salt": ""}  # fmt: skip
        for route, body in (("completions", {"model": name, "prompt": SHARED, "cache_salt": ""}),
                            ("chat/completions", chat)):  # fmt: skip
            r = httpx.post(srv.url_for("v1", route), json=body, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "cache_salt", r.text
            assert "non-empty string" in r.json()["error"]["message"]
    finally:
        srv.stop()
