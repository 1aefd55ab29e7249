"""Speculative decoding with chunked prefill on CPU float32.

A step that holds a prefill chunk runs the target alone (its decode rows get one token, no
proposals; the draft model runs over the chunk and later catches up on those rows'
tokens); decode-only steps speculate. With an 8-token budget and 2 sequences at a time,
prompts longer than the budget are chunked and later prompts' chunks share steps with
earlier ones' decodes, and the output equals unchunked speculation: greedy tokens and
logprobs (within 5e-5: a chunked prompt's KV is summed in other batch shapes), the seeded
row's tokens, and for greedy rows the tokens without speculation.
"""

import pytest

from tests.spec_decode.spec_runs import assert_runs_close, run_token_prompts

PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],
    [100, 200, 300, 400],
    list(range(11, 31)),
    [42] * 9,
    [9, 99, 999],
]
# tests/conftest.py CYCLES: 40 41 42 and 50 51 52 53 repeat, so n-grams are accepted
NGRAM_PROMPTS = [[40, 41, 42, 40, 41, 42, 40, 41, 42, 40], [50, 51], [5, 40, 41] * 4, [53, 50]]


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _run(model, prompts, params, **kw):
    return run_token_prompts(model, prompts, params, max_num_seqs=2, **kw)


CHUNKED = dict(enable_chunked_prefill=True, max_num_batched_tokens=8)


@pytest.mark.forked
def test_draft_model_with_chunked_prefill(tiny_llama_dir, truncated_llama_dir):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=10, logprobs=2) for _ in PROMPTS]
    params[3] = SamplingParams(temperature=0.8, seed=5, max_tokens=10)
    spec = dict(speculative_model=truncated_llama_dir, num_speculative_tokens=3)
    plain, _ = _run(tiny_llama_dir, PROMPTS, params)
    whole, whole_metrics = _run(tiny_llama_dir, PROMPTS, params, **spec)
    chunked, metrics = _run(tiny_llama_dir, PROMPTS, params, **spec, **CHUNKED)
    greedy = [0, 1, 2, 4]
    assert_runs_close(whole, plain, greedy, 5e-5)
    assert_runs_close(chunked, whole, range(len(PROMPTS)), 5e-5)
    # fewer speculative steps than unchunked (mixed steps propose nothing), but some
    assert 0 < metrics["num_spec_steps"] <= whole_metrics["num_spec_steps"], metrics


@pytest.mark.forked
def test_ngram_with_chunked_prefill(cycling_llama_dir):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    plain, _ = _run(cycling_llama_dir, NGRAM_PROMPTS, params)
    chunked, metrics = _run(cycling_llama_dir, NGRAM_PROMPTS, params, speculative_config=ngram,
                            **CHUNKED)  # fmt: skip
    assert plain[0][0][:4] == [41, 42, 40, 41] and plain[1][0][:4] == [52, 53, 50, 51]
    assert_runs_close(chunked, plain, range(len(NGRAM_PROMPTS)), 5e-5)
    assert metrics["num_accepted_tokens"] >= 10, metrics


@pytest.mark.forked
def test_draft_equal_to_target_accepts_everything_with_chunked_prefill(tiny_llama_dir):
    """With the target as its own draft every greedy proposal is accepted exactly when the
    draft's cache holds every true token: the chunks it ran over, and the tokens of decode
    rows that shared a step with a chunk (proposing nothing there), caught up later."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=10)
    plain, _ = _run(tiny_llama_dir, PROMPTS, params)
    got, metrics = _run(tiny_llama_dir, PROMPTS, params, speculative_model=tiny_llama_dir,
                        num_speculative_tokens=3, **CHUNKED)  # fmt: skip
    assert [g[0] for g in got] == [p[0] for p in plain]
    assert metrics["num_draft_tokens"] >= 20, metrics
    assert metrics["num_accepted_tokens"] == metrics["num_draft_tokens"], metrics


@pytest.mark.forked
def test_recomputed_siblings_of_different_lengths(tiny_llama_dir, truncated_llama_dir):
    """Speculation accepts different numbers of tokens for the siblings of an n > 1 request;
    a small cache preempts such groups, and their recompute under chunked prefill follows
    the longest sibling (a shorter one's rows stop at its end): every sibling finishes with
    its max_tokens, and the engine never fails a step."""
    from vllm import LLM, SamplingParams
    from vllm.core import chunked_prefill

    uneven = []
    add = chunked_prefill._Chunks.add

    def spy(self, group, start, seqs, first=False):
        if len({s.get_len() for s in seqs}) > 1:
            uneven.append(group.request_id)
        return add(self, group, start, seqs, first)

    chunked_prefill._Chunks.add = spy
    llm = LLM(
        model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=64, block_size=8,
        num_gpu_blocks_override=24, max_num_seqs=8, enable_chunked_prefill=True,
        max_num_batched_tokens=8, enable_prefix_caching=False,
        speculative_config={"model": truncated_llama_dir, "num_speculative_tokens": 3},
    )  # fmt: skip
    prompts = [[7, 8, 9, 10] * 3, [7, 8, 9, 10] * 3 + [5], [11, 12] * 4, [7, 8, 9, 10] * 2]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, n=3 if i < 3 else 2,
                             ignore_eos=True) for i in range(4)]  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine = llm.llm_engine
    preempted = engine.schedulers[0].num_cumulative_preemption
    failed = dict(engine.failed_requests)
    engine.shutdown()
    assert not failed, failed
    assert [[len(c.token_ids) for c in o.outputs] for o in outs] == [[40] * 3] * 3 + [[40] * 2]
    assert preempted > 0 and uneven, (preempted, uneven)
