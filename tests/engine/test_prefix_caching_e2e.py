"""Automatic prefix caching end to end on CPU float32 (TORCH_SDPA): a request whose prompt
prefix is cached returns what a fresh engine returns, and the counters show the reuse."""

import gc
import math
import random

import pytest

from tests.utils import completion_tuple

BS = 4
MAX_TOKENS = 12


def _params(**kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5, ignore_eos=True, **kw)


def _assert_same(ref, got, what):
    """Token ids equal; every position's top logprobs equal within 1e-5, relative above 1
    (the cached run attends through the paged cache with an explicit mask instead of SDPA's
    causal flag, which may change the last bits of float32 sums; how many bits depends on
    the intra-op thread count)."""
    (ref_ids, _, ref_lps), (ids, _, lps) = ref, got
    assert ids == ref_ids, f"{what}: {ids} != {ref_ids}"
    assert len(set(ids)) >= 3, f"{what}: too few distinct tokens to prove anything: {ids}"
    for pos, (a, b) in enumerate(zip(ref_lps, lps)):
        assert a.keys() == b.keys(), f"{what}: top-5 ids differ at {pos}"
        for t in a:
            assert math.isclose(a[t], b[t], rel_tol=1e-5, abs_tol=1e-5), (
                f"{what}: logprob of {t} at {pos}: {a[t]} vs {b[t]}"
            )


def _engine(model, caching, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", block_size=BS, enable_prefix_caching=caching, **kw)


def _close(llm):
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


# (shared prefix tokens, second prompt's own tail tokens, expected cached tokens)
CASES = [
    (0, 6, 0),  # nothing shared
    (BS - 1, 6, 0),  # 1 block - 1 token: no full block shared
    (3 * BS, 5, 3 * BS),  # a 3-block prefix
    (2 * BS, 0, BS),  # exactly k blocks, the whole prompt: the last block is computed
    (3 * BS + 2, 0, 3 * BS),  # the whole prompt, not block aligned
]


@pytest.mark.forked
def test_cached_prefix_equals_fresh_engine(tiny_llama_dir):
    rng = random.Random(1)
    firsts, seconds = [], []
    for shared, tail, _ in CASES:
        prefix = [rng.randrange(10, 300) for _ in range(shared)]
        first_tail = [rng.randrange(10, 300) for _ in range(7)] if tail else []
        firsts.append({"prompt_token_ids": prefix + first_tail})
        seconds.append({"prompt_token_ids": prefix + [rng.randrange(10, 300) for _ in range(tail)]})
    fresh = _engine(tiny_llama_dir, caching=False)
    # Each alone, as the cached engine runs it (batch composition changes float32 sums).
    refs = []
    for p in seconds:
        (out,) = fresh.generate([p], _params(), use_tqdm=False)
        assert out.num_cached_tokens == 0
        refs.append(completion_tuple(out))
    _close(fresh)

    llm = _engine(tiny_llama_dir, caching=True)
    bm = llm.llm_engine.schedulers[0].block_manager
    for i, (_, _, expected) in enumerate(CASES):
        first = llm.generate([firsts[i]], _params(), use_tqdm=False)[0]
        assert first.num_cached_tokens == 0
        hits_before = bm.num_hit_tokens
        second = llm.generate([seconds[i]], _params(), use_tqdm=False)[0]
        assert second.num_cached_tokens == expected, f"case {CASES[i]}"
        assert bm.num_hit_tokens - hits_before == expected
        _assert_same(refs[i], completion_tuple(second), f"case {CASES[i]}")
    assert bm.get_num_free_gpu_blocks() == bm.get_num_total_gpu_blocks()
    _close(llm)


@pytest.mark.forked
def test_eviction_under_a_small_cache_equals_roomy_run(tiny_llama_dir):
    """Many distinct prompts sharing two prefixes through a 24-block cache: cached blocks
    are evicted and reused, outputs equal a roomy uncached run, and every block is free
    again at the end (nothing freed twice: the pool raises on that; nothing leaked)."""
    rng = random.Random(2)
    heads = [[rng.randrange(10, 300) for _ in range(2 * BS)] for _ in range(2)]
    prompts = [
        {"prompt_token_ids": heads[i % 2] + [rng.randrange(10, 300) for _ in range(3 + i % 5)]}
        for i in range(16)
    ]
    waves = [prompts[i : i + 4] for i in range(0, 16, 4)]  # later waves find cached blocks
    roomy = _engine(tiny_llama_dir, caching=False)
    refs = [
        completion_tuple(o) for w in waves for o in roomy.generate(w, _params(), use_tqdm=False)
    ]
    _close(roomy)
    llm = _engine(
        tiny_llama_dir, caching=True, num_gpu_blocks_override=23, max_num_seqs=4, max_model_len=64
    )
    bm = llm.llm_engine.schedulers[0].block_manager
    start = bm.get_num_free_gpu_blocks()
    got = []
    for w in waves:
        got.extend(completion_tuple(o) for o in llm.generate(w, _params(), use_tqdm=False))
    for i, (r, g) in enumerate(zip(refs, got)):
        _assert_same(r, g, f"prompt {i}")
    assert bm.num_hit_tokens > 0
    assert bm.pool.num_cached() > 0 and bm.pool.num_evictions > 0
    assert bm.get_num_free_gpu_blocks() == start == bm.get_num_total_gpu_blocks()


@pytest.mark.forked
def test_cache_salt_shares_blocks_only_within_a_salt(tiny_llama_dir):
    """``cache_salt`` in a prompt dict: blocks cached under one salt are found only by
    requests of that salt (not by another salt, nor by unsalted requests, nor the other
    way round), the outputs equal the uncached run, and a salt that is not a non-empty
    string is a ValueError naming it, after which the engine still serves."""
    rng = random.Random(3)
    shared = [rng.randrange(10, 300) for _ in range(3 * BS)]
    prompts = [shared + [rng.randrange(10, 300) for _ in range(3)] for _ in range(6)]
    fresh = _engine(tiny_llama_dir, caching=False)
    refs = [completion_tuple(fresh.generate([{"prompt_token_ids": p}], _params(),
                                            use_tqdm=False)[0]) for p in prompts]  # fmt: skip
    _close(fresh)

    llm = _engine(tiny_llama_dir, caching=True)
    # (salt, cached tokens expected): each salt's first request finds nothing
    runs = [("a", 0), ("b", 0), ("a", 3 * BS), (None, 0), ("b", 3 * BS), (None, 3 * BS)]
    for i, (salt, expected) in enumerate(runs):
        prompt = {"prompt_token_ids": prompts[i]}
        if salt is not None:
            prompt["cache_salt"] = salt
        (out,) = llm.generate([prompt], _params(), use_tqdm=False)
        assert out.num_cached_tokens == expected, f"run {i} salt={salt!r}"
        _assert_same(refs[i], completion_tuple(out), f"run {i} salt={salt!r}")
    for bad in ("", 7):
        with pytest.raises(ValueError, match=f"cache_salt must be a non-empty string, got {bad!r}"):
            llm.generate([{"prompt_token_ids": prompts[0], "cache_salt": bad}], _params(),
                         use_tqdm=False)  # fmt: skip
    (out,) = llm.generate([{"prompt_token_ids": prompts[0], "cache_salt": "a"}], _params(),
                          use_tqdm=False)  # fmt: skip
    assert out.num_cached_tokens == 3 * BS
    _assert_same(refs[0], completion_tuple(out), "after the errors")
    _close(llm)
