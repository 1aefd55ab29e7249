"""Speculative decoding end to end on CPU float32: outputs equal the run without
speculation exactly (docs/design.md), and the counters prove the speculative path ran."""

import pytest

from tests.utils import check_outputs_equal

COMBOS = [(1, 4), (3, 4), (8, 4)]
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [100, 200, 300, 400], [11, 12, 13], [42] * 5, [9, 99, 999]]
NGRAM_PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "red green blue, red green blue, red green blue, red green",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,",
]


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _run(model, prompts, max_tokens, **kw):
    """(greedy (ids, text, None) per prompt, spec metrics, proposer-state count)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, device="cpu", **kw)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate(list(prompts), params, use_tqdm=False)
    res = [(list(o.outputs[0].token_ids), o.outputs[0].text, None) for o in outs]
    eng = llm.llm_engine
    metrics = eng.spec_decode_metrics()
    worker = eng.executor.worker
    states = worker.num_proposer_states() if hasattr(worker, "num_proposer_states") else 0
    eng.shutdown()
    return res, metrics, states


def _distinct(outputs, minimum):
    for ids, _, _ in outputs:
        assert len(set(ids)) >= minimum, ids


@pytest.mark.forked
@pytest.mark.parametrize("max_num_seqs, k", COMBOS)
def test_draft_model_exact(tiny_llama_dir, truncated_llama_dir, max_num_seqs, k):
    base, none, _ = _run(tiny_llama_dir, PROMPTS, 16, max_num_seqs=max_num_seqs)
    assert none is None
    _distinct(base, 8)
    same, m_same, st1 = _run(
        tiny_llama_dir, PROMPTS, 16, max_num_seqs=max_num_seqs,
        speculative_model=tiny_llama_dir, num_speculative_tokens=k,
    )  # fmt: skip
    check_outputs_equal(base, same, "no spec", "draft = target", PROMPTS)
    assert m_same["num_draft_tokens"] > 0
    assert m_same["num_accepted_tokens"] == m_same["num_draft_tokens"]
    assert m_same["draft_acceptance_rate"] == 1.0
    trunc, m_tr, st2 = _run(
        tiny_llama_dir, PROMPTS, 16, max_num_seqs=max_num_seqs,
        speculative_model=truncated_llama_dir, num_speculative_tokens=k,
    )  # fmt: skip
    check_outputs_equal(base, trunc, "no spec", "truncated draft", PROMPTS)
    assert 0 < m_tr["num_accepted_tokens"] < m_tr["num_draft_tokens"], m_tr
    assert 0 < m_tr["system_efficiency"] < 1
    assert st1 == st2 == 0  # every request finished: no per-sequence state left


@pytest.mark.forked
def test_ngram_exact_smollm2(smollm2_gguf):
    """N-gram prompt lookup on the real model (a random tiny model never repeats itself, so
    lookup would find nothing): prompts repeat spans; one baseline (CPU float32 batched =
    alone, exact) against each (max_num_seqs, k) combination, in one process to load the
    GGUF fewer times. COMBOS without (8, 4): with three prompts, max_num_seqs 3 and 8 both
    run all of them in every step (the same batches), so one batched setting suffices."""
    base, _, _ = _run(smollm2_gguf, NGRAM_PROMPTS, 12, max_num_seqs=8, max_model_len=256)
    for max_num_seqs, k in [(1, 4), (3, 4)]:
        spec, m, st = _run(
            smollm2_gguf, NGRAM_PROMPTS, 12, speculative_model="[ngram]",
            num_speculative_tokens=k, ngram_prompt_lookup_max=3, max_num_seqs=max_num_seqs,
            max_model_len=256,
        )  # fmt: skip
        check_outputs_equal(base, spec, "no spec", f"ngram {max_num_seqs, k}", NGRAM_PROMPTS)
        assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m
        assert st == 0


@pytest.mark.forked
@pytest.mark.parametrize("spec_model", ["target", "[ngram]"])
def test_capping_near_max_model_len(tiny_llama_dir, spec_model):
    """Sequences reach limit-k-1, limit-k, limit-2 and limit-1 tokens (prompts of those
    lengths, so the proposal cap shrinks k, k-1, ..., 0 over the run): every request ends at
    exactly max_model_len tokens, as without speculation. (A prompt of ``limit`` tokens
    gets one token from the prefill alone, before any proposal.)"""
    limit, k = 48, 4
    prompts = [[(7 * i + 3) % 5000 + 10 for i in range(n)] for n in
               (limit - k - 1, limit - k, limit - 2, limit - 1)]  # fmt: skip
    kw = dict(max_num_seqs=4, max_model_len=limit)
    base, _, _ = _run(tiny_llama_dir, prompts, 20, **kw)
    model = tiny_llama_dir if spec_model == "target" else spec_model
    spec, m, _ = _run(
        tiny_llama_dir, prompts, 20, speculative_model=model, num_speculative_tokens=k,
        ngram_prompt_lookup_max=2, **kw,
    )  # fmt: skip
    check_outputs_equal(base, spec, "no spec", spec_model, prompts)
    for p, (ids, _, _) in zip(prompts, spec):
        assert len(p) + len(ids) == limit  # exactly up to the limit, never past it
    if spec_model == "target":
        assert m["num_draft_tokens"] > 0


@pytest.mark.forked
def test_stop_conditions_inside_multi_token_steps(tiny_llama_dir):
    """EOS-like stop tokens and max_tokens that fall inside an accepted run: nothing after
    the stop is returned, same as without speculation."""
    from vllm import LLM, SamplingParams

    outs = {}
    for spec in (False, True):
        kw = dict(speculative_model=tiny_llama_dir, num_speculative_tokens=4) if spec else {}
        llm = LLM(model=tiny_llama_dir, device="cpu", max_num_seqs=4, **kw)
        free = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=12),
                            use_tqdm=False)  # fmt: skip
        stop_tok = free[0].outputs[0].token_ids[6]
        params = [
            SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_tok]),
            SamplingParams(temperature=0, max_tokens=7),
        ]
        got = llm.generate(PROMPTS[:2], params, use_tqdm=False)
        outs[spec] = [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
                       o.outputs[0].stop_reason) for o in got]  # fmt: skip
        if spec:
            assert llm.llm_engine.spec_decode_metrics()["num_accepted_tokens"] > 0
        llm.llm_engine.shutdown()
    assert outs[True] == outs[False]
    assert outs[True][0][1] == "stop" and outs[True][0][0][-1] == outs[True][0][2]
    assert len(outs[True][1][0]) == 7 and outs[True][1][1] == "length"


@pytest.mark.forked
def test_proposer_state_dropped_with_aborts(tiny_llama_dir):
    """Many short requests, 10% aborted mid-flight: no per-sequence state remains."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    eng = LLMEngine.from_engine_args(
        EngineArgs(model=tiny_llama_dir, device="cpu", max_num_seqs=8,
                   speculative_model=tiny_llama_dir, num_speculative_tokens=2,
                   disable_log_stats=True)
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=3)
    n, aborted = 200, 0
    for i in range(n):
        eng.add_request(str(i), [10 + i % 50, 20, 30 + i % 7], params)
        if i % 10 == 9:
            eng.step()
            eng.abort_request(str(i - 1))
            aborted += 1
        if i % 8 == 7:
            eng.step()
    while eng.has_unfinished_requests():
        eng.step()
    worker = eng.executor.worker
    assert aborted == n // 10
    assert worker.num_proposer_states() == 0
    assert worker.proposer.draft_len == {}
    assert eng.spec_decode_metrics()["num_draft_tokens"] > 0
    eng.shutdown()


def _engine_run(model, prompts, params, **kw):
    """Drive an LLMEngine directly; returns (outputs by request, preemptions, metrics)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    eng = LLMEngine.from_engine_args(
        EngineArgs(model=model, device="cpu", disable_log_stats=True, **kw)
    )
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = (list(o.outputs[0].token_ids), o.outputs[0].text, None)
    preempted = sum(s.num_cumulative_preemption for s in eng.schedulers)
    metrics = eng.spec_decode_metrics()
    states = eng.executor.worker.num_proposer_states() if metrics is not None else 0
    eng.shutdown()
    return [done[str(i)] for i in range(len(prompts))], preempted, metrics, states


@pytest.mark.forked
def test_preemption_under_speculation_equals_roomy_run(tiny_llama_dir, truncated_llama_dir):
    """A cache too small for 8 sequences with k = 4 lookahead slots preempts (recompute;
    the draft cache is refilled by its prefill) and still equals a roomy run."""
    from vllm import SamplingParams

    prompts = [[10 + i, 20 + 3 * i, 30, 40 + i, 50] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=24)
    spec = dict(speculative_model=truncated_llama_dir, num_speculative_tokens=4, max_num_seqs=8)
    roomy, p0, _, _ = _engine_run(tiny_llama_dir, prompts, params, max_num_seqs=8)
    tight, p1, m, st = _engine_run(
        tiny_llama_dir, prompts, params, num_gpu_blocks_override=11, max_model_len=128, **spec
    )
    assert p0 == 0 and p1 > 0, (p0, p1)
    check_outputs_equal(roomy, tight, "roomy, no spec", "preempted, spec", prompts)
    assert 0 < m["num_accepted_tokens"] < m["num_draft_tokens"] and st == 0


@pytest.mark.forked
def test_disable_by_batch_size_and_draft_catch_up(tiny_llama_dir, truncated_llama_dir):
    """With speculative_disable_by_batch_size=3, steps with >= 3 running requests decode
    normally (the draft cache falls behind), later steps speculate after feeding the draft
    the positions it missed; outputs stay exact."""
    from vllm import SamplingParams

    prompts = [[10 + i, 20 + 3 * i, 30, 40 + i] for i in range(4)]
    lens = [4, 6, 20, 30]
    base, spec = [], []
    for p, n in zip(prompts, lens):
        params = SamplingParams(temperature=0, max_tokens=n)
        base.append(_engine_run(tiny_llama_dir, [p], params, max_num_seqs=4)[0][0])
    params = [SamplingParams(temperature=0, max_tokens=n) for n in lens]
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    eng = LLMEngine.from_engine_args(
        EngineArgs(model=tiny_llama_dir, device="cpu", max_num_seqs=4, disable_log_stats=True,
                   speculative_model=tiny_llama_dir, num_speculative_tokens=3,
                   speculative_disable_by_batch_size=3)
    )  # fmt: skip
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = (list(o.outputs[0].token_ids), o.outputs[0].text, None)
    m = eng.spec_decode_metrics()
    spec = [done[str(i)] for i in range(4)]
    eng.shutdown()
    check_outputs_equal(base, spec, "alone, no spec", "spec, disabled by batch size", prompts)
    # draft = target: every proposal is accepted, so the caught-up draft cache was right
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] == m["num_draft_tokens"]


@pytest.mark.forked
def test_seeded_sampling_reproducible(tiny_llama_dir, truncated_llama_dir):
    """Sampling through the rejection sampler: a seeded request gives the same tokens in two
    engines, whatever else is in the batch."""
    from vllm import SamplingParams

    outs = []
    for extra in (0, 2):
        prompts = [[10, 20, 30, 40]] + [[50 + j, 60] for j in range(extra)]
        params = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=16)
        res, _, m, _ = _engine_run(
            tiny_llama_dir, prompts, params, max_num_seqs=4,
            speculative_model=truncated_llama_dir, num_speculative_tokens=3,
        )  # fmt: skip
        assert m["num_draft_tokens"] > 0
        outs.append(res[0][0])
    assert outs[0] == outs[1] and len(outs[0]) == 16


def _repeats(model, seeds, **kw) -> tuple[int, dict | None]:
    """Seeded temperature-1 samples of one prompt, one request per seed: how often a token
    repeats the one before it, and the engine's speculation counters."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, device="cpu", max_model_len=128, **kw)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=10, ignore_eos=True)
              for s in seeds]  # fmt: skip
    outs = llm.generate([[10, 20, 30, 40]] * len(seeds), params, use_tqdm=False)
    ids = [o.outputs[0].token_ids for o in outs]
    metrics = llm.llm_engine.spec_decode_metrics()
    llm.llm_engine.shutdown()
    return sum(a == b for t in ids for a, b in zip(t, t[1:])), metrics


@pytest.mark.forked
def test_seeded_draft_does_not_replay_the_targets_draws(tiny_llama_dir):
    """A seeded request's draft model draws its own random stream. With the target's seed
    the draft (here the target itself) replays the noise the target drew a step before,
    proposes the token just emitted, and the rejection sampler accepts it: the output
    repeats tokens far more often than the target samples them (11 repeats in 900 pairs
    against none without speculation, on this model)."""
    seeds = range(100)
    plain, _ = _repeats(tiny_llama_dir, seeds)
    spec, m = _repeats(
        tiny_llama_dir, seeds,
        speculative_config={"model": tiny_llama_dir, "num_speculative_tokens": 3},
    )  # fmt: skip
    assert m["num_draft_tokens"] > 0
    assert spec <= plain + 3, (spec, plain)


@pytest.mark.forked
def test_draft_graph_memory_comes_off_the_kv_budget(tiny_llama_dir, truncated_llama_dir):
    """The draft's CUDA graph memory (its runner's estimate) is taken off the blocks both
    caches share: with the estimate forced to 3 target blocks + 1 byte, 4 target blocks
    come off before the target / draft split, and a budget the draft's graphs exhaust
    raises naming the bytes (CPU: the estimate is otherwise 0)."""
    from vllm import LLM

    llm = LLM(
        model=tiny_llama_dir, device="cpu", max_num_seqs=2,
        speculative_model=truncated_llama_dir, num_speculative_tokens=2,
    )  # fmt: skip
    worker = llm.llm_engine.executor.worker
    target = worker.target.determine_num_available_blocks()
    tb = worker.target.get_cache_block_size_bytes()
    db = worker.draft_worker.get_cache_block_size_bytes()
    assert worker.determine_num_available_blocks() == (target + 1) * tb // (tb + db) - 1
    runner = worker.draft_worker.model_runner
    runner.estimate_graph_memory = lambda num_virtual_engines: 3 * tb + 1
    assert worker.determine_num_available_blocks() == (target + 1 - 4) * tb // (tb + db) - 1
    runner.estimate_graph_memory = lambda num_virtual_engines: (target + 1) * tb
    with pytest.raises(ValueError, match=f"less {(target + 1) * tb} bytes of draft CUDA"):
        worker.determine_num_available_blocks()
    llm.llm_engine.shutdown()
