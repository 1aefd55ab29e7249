"""Multi-step decoding with tensor parallelism on CPU (gloo, mp executor, float32).

At TP = 2 every rank runs a call's passes; TP rank 0 samples and broadcasts the ids the
next pass reads. The same two ranks sum their partial products in the same order whatever
the steps per call, so 4 passes per call (with chunked prefill) give exactly the
tokens of one pass per call, and logprobs within 1e-5 (a row that stops inside a call keeps
computing to the call's end, so later passes multiply other batch shapes): greedy with
logprobs, seeded samples, n = 2, a repetition penalty (whose inputs grow on rank 0 between
passes), and a stop token and max_tokens that land inside a call.
"""

import pytest

from tests.utils import deadline, stage_start_method

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [100, 200, 300, 400], [11, 12, 13], [42] * 5, [9, 99, 999]]


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())


def _params(stop_token=None):
    from vllm import SamplingParams

    ps = [SamplingParams(temperature=0, max_tokens=5 + 3 * i, logprobs=3) for i in range(5)]
    ps[0] = SamplingParams(temperature=0, max_tokens=20, logprobs=3,
                           stop_token_ids=[] if stop_token is None else [stop_token])  # fmt: skip
    ps[2] = SamplingParams(temperature=0.9, seed=7, max_tokens=13, n=2)
    ps[3] = SamplingParams(temperature=0, max_tokens=14, repetition_penalty=1.5)
    return ps


def _run(model, params, **kw):
    from vllm import LLM

    llm = LLM(model=model, device="cpu", dtype="float32", tensor_parallel_size=2, max_num_seqs=8,
              **kw)  # fmt: skip
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    return [
        [
            (
                list(c.token_ids),
                None
                if c.logprobs is None
                else [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs],  # fmt: skip
                c.finish_reason,
            )
            for c in o.outputs
        ]
        for o in outs
    ]


@pytest.mark.forked
def test_tp2_multi_step_equals_tp2_one_step(tiny_llama_dir):
    with deadline(300):
        ref = _run(tiny_llama_dir, _params())
        first = ref[0][0][0]
        assert len(first) == 20 and all(len(set(r[0][0])) >= 3 for r in ref), ref
        stop = first[6]
        assert stop not in first[:6]
        # an 8-token budget splits the 23 prompt tokens over mixed steps of one pass; the
        # decode-only calls after them run up to 4 passes
        got = _run(tiny_llama_dir, _params(stop), num_scheduler_steps=4,
                   enable_chunked_prefill=True, max_num_batched_tokens=8)  # fmt: skip
    assert got[0][0][0] == first[:7] and got[0][0][2] == "stop", got[0]
    _assert_close(got[0][0][1], ref[0][0][1][:7], "request 0")
    for i, (r, g) in enumerate(zip(ref[1:], got[1:]), 1):
        assert [(c[0], c[2]) for c in g] == [(c[0], c[2]) for c in r], i
        _assert_close(g[0][1], r[0][1], i)


def _assert_close(got, ref, what):
    """Per position the same top ids and logprobs within 1e-5 (None: no logprobs asked)."""
    assert (got is None) == (ref is None), what
    for pos, (a, b) in enumerate(zip(ref or [], got or [], strict=True)):
        assert a.keys() == b.keys(), (what, pos)
        assert all(abs(a[t] - b[t]) < 1e-5 for t in a), (what, pos, a, b)
