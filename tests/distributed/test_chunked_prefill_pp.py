"""Chunked prefill under pipeline parallelism on CPU (gloo, mp executor, float32): each
virtual engine chunks its own prompts within its own budget, and the outputs equal the
unchunked PP = 1 run (token ids exactly, logprobs within 5e-5: a chunk attends to its
cached context through the paged cache with an explicit mask)."""

import random

import pytest

from tests.utils import completion_tuple, deadline, stage_start_method

LENS = (1, 15, 17, 60, 33, 3)


@pytest.fixture(autouse=True)
def _stage_workers(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")
    # The PP = 1 reference runs torch CPU ops in this process before the workers start:
    # fork only where that is safe (stage_start_method).
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())


def _run(model, prompts, **kw):
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, device="cpu", block_size=16, max_num_seqs=4, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        counters = llm.llm_engine.decode_step_counters()
        return [completion_tuple(o) for o in outs], counters
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.forked
def test_chunked_pp2_equals_unchunked_pp1(tiny_llama_dir):
    rng = random.Random(2)
    prompts = [{"prompt_token_ids": [rng.randrange(10, 300) for _ in range(n)]} for n in LENS]
    with deadline(240):
        ref, _ = _run(tiny_llama_dir, prompts)
        got, counters = _run(tiny_llama_dir, prompts, pipeline_parallel_size=2,
                             enable_chunked_prefill=True, max_num_batched_tokens=8)  # fmt: skip
    for n, (ref_ids, _, ref_lps), (ids, _, lps) in zip(LENS, ref, got):
        assert ids == ref_ids, f"prompt of {n}: {ids} != {ref_ids}"
        assert len(set(ids)) >= 3, ids
        for a, b in zip(ref_lps, lps):
            assert a.keys() == b.keys()
            assert all(abs(a[t] - b[t]) < 5e-5 for t in a), (n, a, b)
    stage0 = counters[0]  # per-stage snapshots: both virtual engines ran mixed steps
    assert all(stage0["eager"][ve].get("mixed", 0) > 0 for ve in (0, 1)), stage0
