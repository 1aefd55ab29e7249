"""speculative_disable_by_batch_size counts running requests, as upstream vLLM does (the
scheduler's running queue), not the sequences of a step: one request with n = 2 under a
threshold of 2 speculates, two requests do not.

Regression: the threshold was compared with the step's sequence count, so a lone request
with n >= threshold never speculated.
"""

import pytest

# cycling_llama_dir (tests/conftest.py) cycles 40 41 42: every n-gram proposal is accepted
PROMPT = [40, 41, 42, 40]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _run(model, prompts, params, **kw):
    """(token ids of every sequence of every prompt, spec counters or None)."""
    from vllm import LLM

    llm = LLM(model=model, device="cpu", dtype="float32", max_num_seqs=4, **kw)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        metrics = llm.llm_engine.spec_decode_metrics()
    finally:
        llm.llm_engine.shutdown()
    return [[list(c.token_ids) for c in o.outputs] for o in outs], metrics


@pytest.mark.forked
def test_threshold_counts_requests_not_sequences(cycling_llama_dir):
    from vllm import SamplingParams

    spec = dict(NGRAM, disable_by_batch_size=2)
    params = SamplingParams(temperature=0, max_tokens=12, n=2)
    ref, _ = _run(cycling_llama_dir, [PROMPT], params)
    assert ref[0][0][:6] == [41, 42, 40, 41, 42, 40]
    # one running request of two sequences: below the threshold, it speculates
    got, metrics = _run(cycling_llama_dir, [PROMPT], params, speculative_config=spec)
    assert got == ref
    assert metrics["num_spec_steps"] >= 4, metrics
    assert metrics["num_accepted_tokens"] == metrics["num_draft_tokens"] > 0, metrics
    # two running requests (n = 1) that finish together: at the threshold, no step speculates
    one = SamplingParams(temperature=0, max_tokens=12)
    got2, metrics2 = _run(cycling_llama_dir, [PROMPT, PROMPT], one, speculative_config=spec)
    assert got2 == [[ref[0][0]], [ref[0][0]]]
    assert metrics2["num_spec_steps"] == 0, metrics2
