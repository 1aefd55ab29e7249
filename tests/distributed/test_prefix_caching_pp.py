"""Prefix-aware routing between virtual engines: the rule alone (real schedulers, no model),
and PP = 2 on gloo (CPU float32) equal to the same run with caching off."""

import gc
import random
from types import SimpleNamespace

import pytest

from tests.utils import completion_tuple

BS = 4


def _engine_stub(num_ve, margin=2):
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler

    cache = CacheConfig(block_size=BS, enable_prefix_caching=True, prefix_routing_margin=margin)
    cache.num_gpu_blocks = 64
    sched = SchedulerConfig(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=256)
    return SimpleNamespace(
        schedulers=[Scheduler(sched, cache) for _ in range(num_ve)],
        config=SimpleNamespace(cache_config=cache),
    )


def _add(stub, ve, tokens, rid):
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Sequence, SequenceGroup

    seq = Sequence(int(rid), None, tokens, BS)
    stub.schedulers[ve].add_seq_group(SequenceGroup(rid, [seq], SamplingParams(max_tokens=4)))


def test_routing_prefers_the_cached_prefix_within_the_margin():
    from vllm.engine.llm_engine import LLMEngine

    stub = _engine_stub(2, margin=2)
    choose = LLMEngine.choose_virtual_engine.__get__(stub)
    head = list(range(10, 10 + 3 * BS))
    _add(stub, 1, head + [1, 2], "0")
    stub.schedulers[1].schedule()  # allocates: VE 1 now caches the 3 head blocks
    assert stub.schedulers[1].block_manager.num_cached_prefix_tokens(head + [5]) == 3 * BS
    # VE 1 has 1 request, VE 0 none: still within the margin -> the cached engine.
    assert choose(head + [7]) == 1
    assert choose([99] * 20) == 0  # nothing cached anywhere: the least loaded
    _add(stub, 1, [50, 51], "1")
    _add(stub, 1, [60, 61], "2")  # VE 1: 3 requests, 3 more than VE 0 > margin 2
    assert choose(head + [7]) == 0
    _add(stub, 0, [70, 71], "3")  # VE 1 has 2 more than VE 0: within the margin again
    assert choose(head + [7]) == 1
    off = _engine_stub(2)
    off.config.cache_config.enable_prefix_caching = False
    assert LLMEngine.choose_virtual_engine.__get__(off)(head) == 0


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")


def _run(model, caching, waves):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model, device="cpu", dtype="float32", block_size=BS, pipeline_parallel_size=2,
        enable_prefix_caching=caching,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    try:
        outs, cached = [], []
        for w in waves:
            for o in llm.generate(w, params, use_tqdm=False):
                outs.append(completion_tuple(o)[0])
                cached.append(o.num_cached_tokens)
        hits = [s.block_manager.num_hit_tokens for s in llm.llm_engine.schedulers]
        return outs, cached, hits
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()


@pytest.mark.forked
def test_pp2_prefix_routing_equals_caching_off(tiny_llama_dir):
    """Wave 1 puts head A on one virtual engine and head B on the other (least loaded);
    wave 2 sends two prompts of each head: least-loaded routing alone would send one of
    each head to the engine without it, prefix-aware routing sends every prompt to its
    head's engine, so all four hit 3 blocks."""
    rng = random.Random(3)
    heads = [[rng.randrange(10, 300) for _ in range(3 * BS)] for _ in range(2)]

    def prompt(h):
        return {"prompt_token_ids": heads[h] + [rng.randrange(10, 300) for _ in range(3)]}

    waves = [[prompt(0), prompt(1)], [prompt(0), prompt(0), prompt(1), prompt(1)]]
    off, _, _ = _run(tiny_llama_dir, False, waves)
    on, cached, hits = _run(tiny_llama_dir, True, waves)
    assert on == off
    assert cached == [0, 0] + [3 * BS] * 4
    assert hits == [6 * BS, 6 * BS]
    assert all(len(set(ids)) >= 3 for ids in on)
