"""The logprobs modes on a GPU with CUDA graphs and multi-step decoding (marked ``gpu``;
skipped without CUDA).

One batch (greedy rows and seeded top-k rows, logprobs=5) and one greedy batch without
logprobs run under raw_logprobs, processed_logprobs and raw_logits (same model, dtype,
backend and batches, so tokens compare exactly): the mode changes what is reported, never
what is sampled; a greedy row's raw and processed values are equal (nothing edits its
logits, temperature 1); a tempered top-k row's processed values differ from its raw ones
with the same top-5 ids; raw_logits reports logits, each position's entries a constant
(its log-sum-exp) above raw_logprobs'. The greedy batch without logprobs runs
decode-loop graphs in both "_logprobs" modes and plain graphs step by step in raw_logits
(the loop graph's static sampler reports log-probabilities only).
"""

import gc
import os

import pytest

pytestmark = pytest.mark.gpu

PROMPTS = [f"Item {i}: the best way to learn a language is" for i in range(8)]
MAX_TOKENS = 24
TOP = 5
MODES = ("raw_logprobs", "processed_logprobs", "raw_logits")


def _floats(logprobs) -> list[dict[int, float]]:
    return [{t: v.logprob for t, v in pos.items()} for pos in logprobs]


def _run_mode(model, mode, monkeypatch):
    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"
    from tests.worker.test_cuda_graphs_gpu import _count_loop_calls
    from vllm import LLM, SamplingParams

    loops = _count_loop_calls(monkeypatch)
    llm = LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
              max_model_len=512, max_num_seqs=16, num_scheduler_steps=8,
              logprobs_mode=mode)  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP)
    params = [greedy] * 4 + [
        SamplingParams(temperature=0.7, top_k=20, seed=i, max_tokens=MAX_TOKENS, logprobs=TOP)
        for i in range(4)
    ]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    mixed = [(list(o.outputs[0].token_ids), _floats(o.outputs[0].logprobs)) for o in outs]
    before = loops["n"]
    plain = llm.generate(
        PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False
    )
    plain_ids = [list(o.outputs[0].token_ids) for o in plain]
    snap = llm.llm_engine.decode_step_counters()
    assert sum(snap["graph"][0].values()) > 0 and set(snap["eager"][0]) <= {"prefill"}, snap
    loop_calls = loops["n"] - before
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return mixed, plain_ids, loop_calls


@pytest.mark.forked
def test_logprobs_modes_with_graphs(smollm2_gguf, monkeypatch):
    runs = {m: _run_mode(smollm2_gguf, m, monkeypatch) for m in MODES}
    raw, proc, logit = (runs[m][0] for m in MODES)
    for m, (mixed, plain_ids, loop_calls) in runs.items():
        assert [ids for ids, _ in mixed] == [ids for ids, _ in raw], m  # sampling unchanged
        assert plain_ids == runs["raw_logprobs"][1], m
        assert all(len(set(ids)) >= 4 for ids in plain_ids), plain_ids
        assert (loop_calls > 0) == m.endswith("_logprobs"), (m, loop_calls)
    for i, ((ids, r), (_, p), (_, g)) in enumerate(zip(raw, proc, logit)):
        for pos, tok in enumerate(ids):
            top_r = sorted(r[pos], key=r[pos].get, reverse=True)[:TOP]
            top_p = sorted(p[pos], key=p[pos].get, reverse=True)[:TOP]
            assert top_r == top_p, (i, pos)  # tempering and top-k keep the order
            if i < 4:  # greedy: the same values in both modes, the sampled one the largest
                assert r[pos] == p[pos], (i, pos)
                assert r[pos][tok] == max(r[pos].values()), (i, pos)
            lse = [g[pos][t] - r[pos][t] for t in top_r]
            assert max(lse) - min(lse) < 1e-3, (i, pos, lse)
        if i >= 4:  # tempered at 0.7 and renormalised over 20 tokens: not the raw values
            assert any(r[pos] != p[pos] for pos in range(len(ids))), i
