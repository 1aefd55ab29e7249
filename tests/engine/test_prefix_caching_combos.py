"""Prefix caching combined with n > 1, preemption by recompute, n-gram speculation and
multi-step decoding (CPU float32): each run with caching on equals the same run with caching
off, and the hit counter proves blocks were reused."""

import gc
import random

import pytest

BS = 4


def _prompts(seed, count, shared=3 * BS, tail=5, repeat=False):
    rng = random.Random(seed)
    head = [rng.randrange(10, 300) for _ in range(shared)]
    out = []
    for i in range(count):
        own = [rng.randrange(10, 300) for _ in range(tail + i % 3)]
        if repeat:  # repeated spans give the n-gram proposer something to find
            own = own + own[:4] + own
        out.append({"prompt_token_ids": head + own})
    return out


def _run(model, caching, prompts, params, waves=2, **kw):
    """Outputs of ``prompts`` sent in ``waves`` generate calls (later waves hit what earlier
    ones cached), with every completion of each request, and the engine's total hit tokens."""
    from vllm import LLM

    llm = LLM(model=model, device="cpu", block_size=BS, enable_prefix_caching=caching, **kw)
    step = -(-len(prompts) // waves)
    outs = []
    for i in range(0, len(prompts), step):
        for o in llm.generate(prompts[i : i + step], params, use_tqdm=False):
            outs.append(
                [(list(c.token_ids), [sorted(lp) for lp in c.logprobs or []]) for c in o.outputs]
            )
    engine = llm.llm_engine
    hits = sum(s.block_manager.num_hit_tokens for s in engine.schedulers)
    preempted = sum(s.num_cumulative_preemption for s in engine.schedulers)
    for s in engine.schedulers:
        bm = s.block_manager
        assert bm.get_num_free_gpu_blocks() == bm.get_num_total_gpu_blocks()
    spec = engine.spec_decode_metrics()
    engine.shutdown()
    del llm
    gc.collect()
    return outs, hits, preempted, spec


def _greedy(max_tokens=12, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


@pytest.mark.forked
def test_n4_siblings_share_prompt_blocks(tiny_llama_dir):
    from vllm import SamplingParams

    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    prompts = _prompts(3, 4)
    off, _, _, _ = _run(tiny_llama_dir, False, prompts, params)
    on, hits, _, _ = _run(tiny_llama_dir, True, prompts, params)
    assert on == off
    assert len({tuple(c[0]) for c in on[0]}) > 1, "the 4 samples are identical"
    assert hits > 0


@pytest.mark.forked
def test_preemption_under_pressure(tiny_llama_dir):
    prompts = _prompts(4, 6, tail=4)
    kw = dict(num_gpu_blocks_override=13, max_num_seqs=6, max_model_len=48)
    off, _, _, _ = _run(tiny_llama_dir, False, prompts, _greedy(24), waves=1, **kw)
    on, hits, preempted, _ = _run(tiny_llama_dir, True, prompts, _greedy(24), waves=1, **kw)
    assert preempted > 0, "no preemption: the test proves nothing"
    assert on == off
    assert hits > 0
    assert len(set(on[0][0][0])) >= 3


@pytest.mark.forked
def test_ngram_speculation(tiny_llama_dir):
    prompts = _prompts(5, 4, repeat=True)
    kw = dict(speculative_model="[ngram]", num_speculative_tokens=3, ngram_prompt_lookup_max=3)
    off, _, _, spec_off = _run(tiny_llama_dir, False, prompts, _greedy(16), **kw)
    on, hits, _, spec_on = _run(tiny_llama_dir, True, prompts, _greedy(16), **kw)
    assert on == off
    assert hits > 0
    assert spec_on["num_draft_tokens"] > 0, spec_on


@pytest.mark.forked
def test_multi_step_decoding(tiny_llama_dir):
    prompts = _prompts(6, 4)
    off, _, _, _ = _run(tiny_llama_dir, False, prompts, _greedy(13), num_scheduler_steps=4)
    on, hits, _, _ = _run(tiny_llama_dir, True, prompts, _greedy(13), num_scheduler_steps=4)
    assert on == off
    assert hits > 0
