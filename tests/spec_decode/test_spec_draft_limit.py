"""A draft whose context limit (speculative max_model_len) is below the target's, with
prefix caching: a prompt longer than the limit still has the draft run over its positions
below the limit, so a later, shorter prompt that shares its cached blocks reads the draft's
true keys there. With the target as its own draft every proposal is then accepted.

Regression: the draft skipped such prompts entirely, the shorter prompt's cache hits left
the draft attending to keys it never wrote, and (draft = target) no proposal was accepted.
"""

import pytest

BASE = list(range(500, 540))  # 40 tokens; the draft's limit is 32, blocks of 8
LONG, SHORT = BASE + [1, 2], BASE[:16] + [3]  # SHORT shares LONG's first two blocks


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _run(model, **kw):
    """(greedy ids of LONG then SHORT, each alone in its step; spec counters; prefix-cache
    hit tokens; proposer states left)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, device="cpu", dtype="float32", block_size=8, max_model_len=128, **kw)
    eng = llm.llm_engine
    try:
        params = SamplingParams(temperature=0, max_tokens=10)
        out = []
        for p in (LONG, SHORT):
            (o,) = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
            out.append(list(o.outputs[0].token_ids))
        metrics = eng.spec_decode_metrics()
        hits = eng.scheduler_gauges()["prefix_hits"]
        states = eng.executor.worker.num_proposer_states() if metrics is not None else 0
    finally:
        eng.shutdown()
    return out, metrics, hits, states


@pytest.mark.forked
def test_draft_keys_below_its_limit_serve_prefix_cache_hits(tiny_llama_dir):
    ref, _, _, _ = _run(tiny_llama_dir)
    assert len(set(ref[1])) >= 5, ref
    spec = {"model": tiny_llama_dir, "num_speculative_tokens": 3, "max_model_len": 32}
    got, metrics, hits, states = _run(tiny_llama_dir, speculative_config=spec)
    assert got == ref
    assert hits == 16  # SHORT found LONG's first two blocks
    # LONG is past the draft's limit (no proposals); SHORT speculates from its cache hits
    assert metrics["num_draft_tokens"] > 0, metrics
    assert metrics["num_accepted_tokens"] == metrics["num_draft_tokens"], metrics
    assert states == 0
