"""Chunked prefill end to end on CPU float32 (TORCH_SDPA): chunked runs return the tokens and
logprobs of unchunked runs for every budget and prompt length, alone, batched with running
decodes and with seeded sampling; running streams get one token per step while a long prompt
is chunked in; prefix caching, n = 4 and preemption under chunking equal the unchunked run.

Logprobs are compared within 5e-5, token ids exactly: a chunk attends to its cached context
through the paged cache with an explicit mask, and a mixed step changes the batch's
composition, both of which may change the last bits of float32 sums.
"""

import random

import pytest

from tests.engine.chunked_engines import BS
from tests.engine.chunked_engines import close as _close
from tests.engine.chunked_engines import engine as _engine
from tests.engine.chunked_engines import prompts as _prompts
from tests.utils import completion_tuple

PROMPT_LENS = (1, 15, 16, 17, 300)
BUDGETS = (BS - 1, BS, 7, 64, 512)  # a block minus one, a block, 7, 64, the whole batch
SEEDED_BUDGETS = (BS, 64)  # seeded sampling is checked at two budgets (CI time)
MAX_TOKENS = 6
TOL = 5e-5


def _greedy(max_tokens=MAX_TOKENS, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=5, ignore_eos=True,
                          **kw)  # fmt: skip


def _seeded(i, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=1.0, seed=100 + i, max_tokens=MAX_TOKENS, logprobs=5,
                          ignore_eos=True, **kw)  # fmt: skip


def _assert_same(ref, got, what, min_distinct=3):
    """Same token ids and, at every position, the same top logprobs within TOL."""
    (ref_ids, _, ref_lps), (ids, _, lps) = ref, got
    assert ids == ref_ids, f"{what}: {ids} != {ref_ids}"
    assert len(set(ids)) >= min_distinct, f"{what}: too few distinct tokens: {ids}"
    for pos, (a, b) in enumerate(zip(ref_lps, lps)):
        assert a.keys() == b.keys(), f"{what}: top-5 ids differ at {pos}"
        for t in a:
            assert abs(a[t] - b[t]) < TOL, f"{what}: logprob of {t} at {pos}: {a[t]} vs {b[t]}"


def _run_cases(llm, prompts, seeded=True):
    """{"alone": each prompt alone, "batched": all prompts batched, "seeded": all batched
    with seeded sampling (when ``seeded``)}."""
    out = {"alone": [completion_tuple(llm.generate([p], _greedy(), use_tqdm=False)[0])
                     for p in prompts]}  # fmt: skip
    out["batched"] = [completion_tuple(o) for o in llm.generate(prompts, _greedy(),
                                                                 use_tqdm=False)]  # fmt: skip
    if seeded:
        params = [_seeded(i) for i in range(len(prompts))]
        out["seeded"] = [completion_tuple(o) for o in llm.generate(prompts, params,
                                                                    use_tqdm=False)]  # fmt: skip
    return out


def _prompt_logprobs(llm, prompt):
    """{position: {token id: logprob}} of a 2-top prompt-logprobs request (None at 0)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    return [None if p is None else {t: lp.logprob for t, lp in p.items()}
            for p in out.prompt_logprobs]  # fmt: skip


def _mixed_steps(llm) -> int:
    return llm.llm_engine.decode_step_counters()["eager"].get(0, {}).get("mixed", 0)


@pytest.mark.forked
def test_chunked_equals_unchunked_for_every_budget(tiny_llama_dir):
    """Budgets 15, 16, 7, 64 and 512 tokens, prompts of 1, 15, 16, 17 and 300 tokens: the
    same tokens and logprobs as the unchunked engine, alone, batched (running decodes mixed
    with chunks: counted as "mixed" steps) and, at budgets 16 and 64, with seeded sampling.
    An n = 2 request of 300-token prompts needs 600 tokens in one step without chunking
    (refused as it is submitted); with chunking it runs."""
    from vllm import SamplingParams

    prompts = _prompts(PROMPT_LENS)
    ref_llm = _engine(tiny_llama_dir, max_num_batched_tokens=512)
    ref = _run_cases(ref_llm, prompts)
    ref_plp = _prompt_logprobs(ref_llm, prompts[-1])
    with pytest.raises(ValueError, match="max_num_batched_tokens=512"):
        ref_llm.generate([prompts[-1]], SamplingParams(n=2, max_tokens=2), use_tqdm=False)
    _close(ref_llm)

    llm = _engine(tiny_llama_dir, enable_chunked_prefill=True, max_num_batched_tokens=7)
    config = llm.llm_engine.scheduler_config
    # One engine for every budget: the schedulers read the budget from this config object.
    assert llm.llm_engine.schedulers[0].scheduler_config is config
    for budget in BUDGETS:
        config.max_num_batched_tokens = budget
        mixed_before = _mixed_steps(llm)
        got = _run_cases(llm, prompts, seeded=budget in SEEDED_BUDGETS)
        for kind, outs in got.items():
            for n, a, b in zip(PROMPT_LENS, ref[kind], outs):
                _assert_same(a, b, f"budget {budget}, {kind}, prompt of {n}")
        if budget < sum(PROMPT_LENS):  # some steps ran decodes beside prefill chunks
            assert _mixed_steps(llm) > mixed_before, budget
    config.max_num_batched_tokens = 64
    (out,) = llm.generate([prompts[-1]], SamplingParams(n=2, max_tokens=2), use_tqdm=False)
    assert [len(c.token_ids) for c in out.outputs] == [2, 2]
    # Prompt logprobs come chunk by chunk (5 chunks of at most 64 tokens) and add up to
    # the unchunked ones.
    plp = _prompt_logprobs(llm, prompts[-1])
    assert len(plp) == len(ref_plp) == 300 and plp[0] is None
    for pos, (a, b) in enumerate(zip(ref_plp[1:], plp[1:]), 1):
        assert a.keys() == b.keys(), pos
        assert all(abs(a[t] - b[t]) < TOL for t in a), (pos, a, b)
    _close(llm)


def test_prompt_longer_than_the_budget_needs_chunking(tiny_llama_dir):
    """Without chunking the budget must cover max_model_len (as before); with it a smaller
    budget is accepted, and the default budget is 2048 tokens."""
    from vllm.engine.arg_utils import EngineArgs

    def config(**kw):
        return EngineArgs(model=tiny_llama_dir, device="cpu", max_num_seqs=8,
                          **kw).create_engine_config()  # fmt: skip

    with pytest.raises(ValueError, match="max_num_batched_tokens=64 is smaller than max_model_len"):
        config(max_num_batched_tokens=64)
    sc = config(max_num_batched_tokens=64, enable_chunked_prefill=True).scheduler_config
    assert (sc.max_num_batched_tokens, sc.max_model_len) == (64, 512)
    assert config(enable_chunked_prefill=True).scheduler_config.max_num_batched_tokens == 2048
    assert config().scheduler_config.max_num_batched_tokens == 2048  # max(512, 2048)
    two = config(enable_chunked_prefill=True, max_num_partial_prefills=2).scheduler_config
    assert two.prefill_chunk_cap == 1024


@pytest.mark.forked
def test_running_streams_get_a_token_every_step_while_a_long_prompt_chunks(
    tiny_llama_long_dir,
):
    """Three streams decode; a 1,000-token prompt arrives. With a 64-token budget every step
    gives each stream exactly one token (its decode row) and the prompt the other 61, so
    the prompt's first token comes with its 17th chunk, each of those steps mixed."""
    llm = _engine(tiny_llama_long_dir, enable_chunked_prefill=True, max_num_batched_tokens=64,
                  max_model_len=1200)  # fmt: skip
    engine = llm.llm_engine
    streams = _prompts((5, 9, 12), seed=3)
    for i, p in enumerate(streams):
        engine.add_request(f"s{i}", p, _greedy(max_tokens=40))
    engine.step()  # the three prompts, whole
    engine.add_request("long", _prompts((1000,), seed=4)[0], _greedy(max_tokens=2))
    mixed_before = _mixed_steps(llm)
    lengths = {f"s{i}": 1 for i in range(3)}
    for n in range(1, 18):
        outs = {o.request_id: o for o in engine.step()}
        for rid in lengths:
            lengths[rid] += 1
            assert len(outs[rid].outputs[0].token_ids) == lengths[rid], (n, rid)
        if n < 17:  # a partial prefill reports nothing
            assert "long" not in outs, n
    assert len(outs["long"].outputs[0].token_ids) == 1
    assert _mixed_steps(llm) - mixed_before == 17
    _close(llm)


@pytest.mark.forked
def test_prefix_caching_n4_and_preemption_equal_unchunked(tiny_llama_dir):
    """Under chunking with a one-block budget and a 10-block cache: a prompt whose 40-token
    prefix is cached starts its chunks after the two cached blocks; an n = 4 seeded request
    and four requests that preempt each other return what the unchunked, uncached engine
    returns."""
    rng = random.Random(5)
    prefix = [rng.randrange(10, 300) for _ in range(40)]
    first, second = ({"prompt_token_ids": prefix + [rng.randrange(10, 300) for _ in range(k)]}
                     for k in (7, 5))  # fmt: skip
    n4 = _prompts((20,), seed=6)[0]
    crowd = _prompts((40, 40, 40, 40), seed=7)
    n4_params = _seeded(0, n=4)
    crowd_params = _greedy(max_tokens=24)

    def run(llm):
        outs = [llm.generate([p], _greedy(), use_tqdm=False)[0] for p in (first, second)]
        (many,) = llm.generate([n4], n4_params, use_tqdm=False)
        crowded = llm.generate(crowd, crowd_params, use_tqdm=False)
        return outs, many, crowded

    ref_llm = _engine(tiny_llama_dir)
    ref = run(ref_llm)
    _close(ref_llm)
    llm = _engine(tiny_llama_dir, enable_chunked_prefill=True, max_num_batched_tokens=BS,
                  enable_prefix_caching=True, num_gpu_blocks_override=9,
                  max_model_len=128)  # fmt: skip
    got = run(llm)
    preemptions = llm.llm_engine.schedulers[0].num_cumulative_preemption
    _close(llm)

    assert got[0][1].num_cached_tokens == 2 * BS
    for what, a, b in zip(("first", "second"), ref[0], got[0]):
        _assert_same(completion_tuple(a), completion_tuple(b), what)
    for i, (a, b) in enumerate(zip(ref[1].outputs, got[1].outputs)):
        assert a.token_ids == b.token_ids, f"n=4 sequence {i}"
    assert len({tuple(c.token_ids) for c in got[1].outputs}) == 4  # the 4 differ
    assert preemptions > 0
    for i, (a, b) in enumerate(zip(ref[2], got[2])):
        _assert_same(completion_tuple(a), completion_tuple(b), f"crowd {i}")
