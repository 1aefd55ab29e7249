"""Prefix caching on a real GPU (bf16, FLASHINFER and TORCH_SDPA; marked ``gpu``): a second
batch sharing a long prefix with the first is logprobs-close to the same batch with caching
off (the cached run attends to the prefix through the paged cache: another kernel shape),
FlashInfer's paged prefill wrapper ran over the cached context, and decode graphs still
replay."""

import gc
import os

import pytest

from tests.utils import check_logprobs_close, vllm_greedy

pytestmark = pytest.mark.gpu

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 8


def _run(model, backend, caching):
    os.environ["VLLM_ATTENTION_BACKEND"] = backend
    from vllm import LLM

    llm = LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
              enable_prefix_caching=caching, small_decode_max_rows=0)  # fmt: skip
    first = [SYSTEM + "Q: What is the capital of France? A:"]
    second = [SYSTEM + f"Q: Name a {w}. A:" for w in ("color", "fruit", "planet", "river")]
    vllm_greedy(llm, first, 8)
    be = llm.llm_engine.executor.worker.model_runner.attn_backend
    prefill_before = getattr(be, "prefill_runs", 0)
    out = vllm_greedy(llm, second, 24, logprobs=5)
    counters = llm.llm_engine.decode_step_counters()
    hits = llm.llm_engine.schedulers[0].block_manager.num_hit_tokens
    prefill_runs = getattr(be, "prefill_runs", 0) - prefill_before
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return out, counters, hits, prefill_runs


def _replays(counters) -> int:
    return sum(n for ve in counters["graph"].values() for n in ve.values())


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["FLASHINFER", "TORCH_SDPA"])
def test_cached_prefix_close_to_uncached_and_graphs_replay(smollm2_gguf, backend):
    off, _, off_hits, _ = _run(smollm2_gguf, backend, False)
    on, counters, hits, prefill_runs = _run(smollm2_gguf, backend, True)
    assert off_hits == 0 and hits >= 4 * 48, hits  # >= 3 blocks of 16 per prompt
    check_logprobs_close(off, on, "caching off", "caching on", ["second"] * 4)
    assert _replays(counters) > 0, counters
    if backend == "FLASHINFER":
        assert prefill_runs > 0  # the cached-context prefill ran on the paged wrapper
