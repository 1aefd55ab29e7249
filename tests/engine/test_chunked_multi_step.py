"""Chunked prefill together with multi-step decoding on CPU float32 (TORCH_SDPA).

A step that holds a prefill chunk runs one pass; a decode-only step runs up to
``num_scheduler_steps`` passes. Token ids equal the unchunked one-token-step engine's
exactly (greedy, seeded, penalties, stop tokens and max_tokens inside a call, n = 2, prefix
caching, preemption), logprobs within 5e-5 (a mixed step changes the batch's composition, which may
change the last bits of float32 sums); the steps themselves show the rule: while a long
prompt is chunked in, each running stream gets one token per step, and once nothing is left
to prefill, several.
"""

import pytest

from tests.engine.chunked_engines import BS
from tests.engine.chunked_engines import close as _close
from tests.engine.chunked_engines import engine as _engine
from tests.engine.chunked_engines import prompts as _prompts
from tests.utils import completion_tuple

TOL = 5e-5


def _params(stop_token=None):
    """Seven requests: greedy with logprobs and lengths that end inside a call, seeded
    samples, an n = 2 seeded request and (when given) a stop token on the first."""
    from vllm import SamplingParams

    ps = [SamplingParams(temperature=0.0, max_tokens=3 + 4 * i, logprobs=3, ignore_eos=True)
          for i in range(4)]  # fmt: skip
    ps[0] = SamplingParams(temperature=0.0, max_tokens=24, logprobs=3, ignore_eos=True,
                           stop_token_ids=[] if stop_token is None else [stop_token])  # fmt: skip
    ps += [SamplingParams(temperature=1.0, seed=10 + i, max_tokens=17, ignore_eos=True)
           for i in range(2)]  # fmt: skip
    ps.append(SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=11, ignore_eos=True))
    return ps


def _results(outs):
    """Per request: (every completion's token ids, the first completion's logprobs, its
    finish reason)."""
    return [
        ([list(c.token_ids) for c in o.outputs], completion_tuple(o)[2], o.outputs[0].finish_reason)
        for o in outs
    ]


def _assert_same(ref, got, what):
    for i, ((ref_ids, ref_lps, ref_fin), (ids, lps, fin)) in enumerate(zip(ref, got)):
        assert ids == ref_ids, f"{what}, request {i}: {ids} != {ref_ids}"
        assert fin == ref_fin, f"{what}, request {i}"
        for pos, (a, b) in enumerate(zip(ref_lps or [], lps or [])):
            assert a.keys() == b.keys(), f"{what}, request {i}: top ids differ at {pos}"
            assert all(abs(a[t] - b[t]) < TOL for t in a), (what, i, pos, a, b)


PROMPT_LENS = (1, 17, 300, 40, 16, 90, 33)


@pytest.mark.forked
def test_chunked_multi_step_equals_unchunked_one_step(tiny_llama_dir):
    """Budgets of 7, 16 and 64 tokens with 3, 4 and 8 passes per decode call, prefix
    caching off and on: every request returns what the unchunked engine returns with one
    token per step, including a stop token inside a call (nothing kept after it)."""
    prompts = _prompts(PROMPT_LENS)
    ref_llm = _engine(tiny_llama_dir)
    ref = _results(ref_llm.generate(prompts, _params(), use_tqdm=False))
    _close(ref_llm)
    first = ref[0][0][0]
    assert all(len(set(r[0][0])) >= 3 for r in ref), "degenerate tiny-model output"
    stop = first[9]
    assert stop not in first[:9]
    ref_stop = _results(
        _engine(tiny_llama_dir).generate(prompts[:1], _params(stop)[:1], use_tqdm=False)
    )
    assert ref_stop[0][0][0] == first[:10] and ref_stop[0][2] == "stop"

    for budget, steps, caching in ((7, 3, True), (16, 4, False), (64, 8, True)):
        what = f"budget {budget}, {steps} steps, caching {caching}"
        llm = _engine(tiny_llama_dir, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                      num_scheduler_steps=steps, enable_prefix_caching=caching)  # fmt: skip
        got = _results(llm.generate(prompts, _params(), use_tqdm=False))
        _assert_same(ref, got, what)
        # the same prompts again: with caching their prefixes come from the cache
        got = _results(llm.generate(prompts[:1], _params(stop)[:1], use_tqdm=False))
        _assert_same(ref_stop, got, what + ", stop token")
        counters = llm.llm_engine.decode_step_counters()["eager"][0]
        _close(llm)
        assert counters.get("mixed", 0) > 0, (what, counters)


@pytest.mark.forked
def test_mixed_steps_run_one_pass_and_decode_steps_several(tiny_llama_long_dir):
    """Three streams decode with 8 passes per call and a 64-token budget. A 1,000-token
    prompt arrives: while it is chunked in (17 steps) each stream gets exactly one token a
    step; the step after its last chunk is decode-only and gives every stream 8 tokens (the
    long request 8 more after its first)."""
    from vllm import SamplingParams

    llm = _engine(tiny_llama_long_dir, enable_chunked_prefill=True, max_num_batched_tokens=64,
                  max_model_len=1200, num_scheduler_steps=8)  # fmt: skip
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    for i, p in enumerate(_prompts((5, 9, 12), seed=3)):
        engine.add_request(f"s{i}", p, params)
    outs = {o.request_id: o for o in engine.step()}  # the three prompts, whole: one token
    assert {r: len(o.outputs[0].token_ids) for r, o in outs.items()} == dict.fromkeys(outs, 1)
    outs = {o.request_id: o for o in engine.step()}  # decode-only: 8 passes
    lengths = {r: len(o.outputs[0].token_ids) for r, o in outs.items()}
    assert lengths == {"s0": 9, "s1": 9, "s2": 9}
    engine.add_request("long", _prompts((1000,), seed=4)[0], params)
    for n in range(1, 18):
        outs = {o.request_id: o for o in engine.step()}
        for rid in lengths:
            lengths[rid] += 1
            assert len(outs[rid].outputs[0].token_ids) == lengths[rid], (n, rid)
        assert ("long" in outs) == (n == 17), n  # a partial prefill reports nothing
    assert len(outs["long"].outputs[0].token_ids) == 1
    outs = {o.request_id: o for o in engine.step()}
    assert {r: len(o.outputs[0].token_ids) for r, o in outs.items()} == {
        **{rid: n + 8 for rid, n in lengths.items()},
        "long": 9,
    }
    _close(llm)


@pytest.mark.forked
def test_preemption_under_chunked_multi_step_equals_unchunked(tiny_llama_dir):
    """Four 40-token prompts of 30 tokens each in a 9-block cache, a one-block budget and 4
    passes per call (3 lookahead slots a row): requests preempt each other and still return
    the unchunked one-step engine's tokens."""
    from vllm import SamplingParams

    crowd = _prompts((40, 40, 40, 40), seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=30, logprobs=2, ignore_eos=True)
    ref_llm = _engine(tiny_llama_dir)
    ref = _results(ref_llm.generate(crowd, params, use_tqdm=False))
    _close(ref_llm)
    llm = _engine(tiny_llama_dir, enable_chunked_prefill=True, max_num_batched_tokens=BS,
                  num_scheduler_steps=4, num_gpu_blocks_override=9,
                  max_model_len=128)  # fmt: skip
    got = _results(llm.generate(crowd, params, use_tqdm=False))
    preemptions = llm.llm_engine.schedulers[0].num_cumulative_preemption
    _close(llm)
    assert preemptions > 0
    _assert_same(ref, got, "preempted")


@pytest.mark.forked
def test_penalties_with_prompts_longer_than_the_budget(tiny_llama_dir):
    """Penalized requests whose prompts take several chunks (a 16-token budget, so some
    steps hold only non-final chunks and sample nothing), with one token per call and with
    4: the unchunked one-step engine's tokens and logprobs. Such a step used to fail with
    IndexError and take every request in it down."""
    from vllm import SamplingParams

    prompts = _prompts((40, 70, 33), seed=5)
    # the random tiny model never repeats a token: penalties that reward repeats change it
    params = [
        SamplingParams(temperature=0.0, max_tokens=14, repetition_penalty=0.3, logprobs=2,
                       ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=14, presence_penalty=-2.0,
                       frequency_penalty=-1.0, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=4, max_tokens=14, repetition_penalty=1.5,
                       min_tokens=3, ignore_eos=True),
    ]  # fmt: skip
    ref_llm = _engine(tiny_llama_dir)
    ref = _results(ref_llm.generate(prompts, params, use_tqdm=False))
    _close(ref_llm)
    assert all(len(set(r[0][0])) < 14 for r in ref[:2]), "the penalties did not matter"
    for steps in (1, 4):
        llm = _engine(tiny_llama_dir, enable_chunked_prefill=True, max_num_batched_tokens=BS,
                      num_scheduler_steps=steps)  # fmt: skip
        got = _results(llm.generate(prompts, params, use_tqdm=False))
        _close(llm)
        _assert_same(ref, got, f"penalties, {steps} steps")
