"""Speculative decoding on a real GPU with CUDA graphs (marked ``gpu``; skipped without CUDA).

Regression guarded: upstream captured graphs only up to max_num_seqs while batch expansion
turns B sequences into B x (k + 1) scorer rows, so (max_num_seqs 8, k 4) looked up
``graph_runners[ve][40]`` and crashed with ``KeyError: 40``. Here the rule captures up to 40
and replays it; with the ceiling lowered to 16 the 40-row steps run eagerly and are counted.

Comparisons (docs/design.md): graphs vs --enforce-eager with the same batch composition ->
exact (bf16); TORCH_SDPA float32 (TF32 off) spec vs no spec -> exact; FLASHINFER bf16 spec
vs no spec (the scorer's expanded batch changes shapes) -> check_logprobs_close.
"""

import os

import pytest

from tests.utils import check_logprobs_close, check_outputs_equal, vllm_greedy

pytestmark = pytest.mark.gpu

# Prompts that repeat spans, so n-gram lookup proposes (docs/design.md), and plain ones.
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "red green blue, red green blue, red green blue, red green",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,",
    "The capital of France is",
    "Monday, Tuesday, Wednesday, Monday, Tuesday,",
    "A B C D A B C D A B",
    "Hello, my name is",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
]


def _llm(model, backend, **kw):
    os.environ["VLLM_ATTENTION_BACKEND"] = backend
    import torch

    from vllm import LLM

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 exact comparisons need it off
    kw.setdefault("device", "cuda")
    kw.setdefault("dtype", "bfloat16")
    kw.setdefault("gpu_memory_utilization", 0.3)
    kw.setdefault("max_model_len", 512)
    return LLM(model=model, **kw)


def _release(llm):
    import gc

    llm.llm_engine.shutdown()
    gc.collect()


def _runners(llm):
    worker = llm.llm_engine.executor.worker
    workers = worker._workers() if hasattr(worker, "_workers") else [worker]
    return [w.model_runner for w in workers]


@pytest.mark.forked
def test_expanded_batch_of_40_is_captured_and_replayed(smollm2_gguf):
    """(max_num_seqs 8, k 4), the draft = the target: every decode step scores
    8 x 5 = 40 rows; the rule captures up to 40 and the step replays size 40."""
    llm = _llm(
        smollm2_gguf, "FLASHINFER", max_num_seqs=8,
        speculative_model=smollm2_gguf, num_speculative_tokens=4,
    )  # fmt: skip
    target, draft = _runners(llm)
    assert target.capture_sizes.sizes[-1] == 40, target.capture_sizes
    assert 40 in target.graph_runner.captured_sizes(0)
    assert draft.capture_sizes.sizes[-1] == 8  # the draft's rule has k = 0
    outs = vllm_greedy(llm, PROMPTS, 24)
    snap = llm.llm_engine.decode_step_counters()
    assert snap["graph"][0].get(40, 0) > 0, snap
    assert set(snap["eager"][0]) == {"prefill"}, snap
    m = llm.llm_engine.spec_decode_metrics()
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m
    assert all(len(ids) > 0 for ids, _, _ in outs)
    _release(llm)


@pytest.mark.forked
def test_ceiling_16_runs_the_scorer_eagerly_and_exactly(smollm2_gguf):
    """The upstream crash case: (8, 4) with --max-cudagraph-capture-size 16. No error; the
    40-row scorer steps run eagerly (counted "too_big"); tokens equal --enforce-eager with
    eager batches padded like the graph run's (same batch composition)."""
    spec = dict(speculative_model=smollm2_gguf, num_speculative_tokens=4, max_num_seqs=8)
    graph = _llm(smollm2_gguf, "FLASHINFER", max_cudagraph_capture_size=16, **spec)
    g = _drifting(graph)
    snap = graph.llm_engine.decode_step_counters()
    assert snap["eager"][0].get("too_big", 0) > 0, snap  # 8 seqs x 5 = 40 rows
    # once at most 3 sequences are left (3 x 5 = 15 rows) the scorer replays graphs
    assert sum(snap["graph"].get(0, {}).values()) > 0, snap
    assert max(snap["graph"][0]) <= 16, snap
    sizes = _runners(graph)[0].capture_sizes
    _release(graph)
    eager = _llm(
        smollm2_gguf, "FLASHINFER", max_cudagraph_capture_size=16, enforce_eager=True, **spec
    )
    for runner in _runners(eager):
        runner.pad_eager_batches = True
    assert _runners(eager)[0].capture_sizes.sizes == sizes.sizes
    e = _drifting(eager)
    check_outputs_equal(g, e, "graphs, ceiling 16", "enforce_eager (padded)", PROMPTS)
    _release(eager)


def _drifting(llm):
    """Greedy outputs of PROMPTS with max_tokens 6, 10, ..., 34 (EOS ignored), so the live
    batch shrinks from 8 sequences to 1 and the scorer's rows from 40 to 5."""
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=0, max_tokens=6 + 4 * i, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]


def _spec_kwargs(proposer, model):
    if proposer == "ngram":
        return dict(speculative_model="[ngram]", ngram_prompt_lookup_max=3)
    return dict(speculative_model=model)


@pytest.mark.forked
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_flashinfer_bf16_spec_logprobs_close(smollm2_gguf, proposer):
    base_llm = _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=8)
    base = vllm_greedy(base_llm, PROMPTS, 32, logprobs=5)
    _release(base_llm)
    llm = _llm(
        smollm2_gguf, "FLASHINFER", max_num_seqs=8, num_speculative_tokens=4,
        **_spec_kwargs(proposer, smollm2_gguf),
    )  # fmt: skip
    spec = vllm_greedy(llm, PROMPTS, 32, logprobs=5)
    m = llm.llm_engine.spec_decode_metrics()
    runner = _runners(llm)[0]
    assert runner.attn_backend.prefill_runs > 0 and runner.attn_backend.decode_runs > 0
    _release(llm)
    check_logprobs_close(base, spec, "no spec", f"spec {proposer}", PROMPTS)
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m


@pytest.mark.forked
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_torch_sdpa_fp32_spec_exact(smollm2_gguf, proposer):
    base_llm = _llm(smollm2_gguf, "TORCH_SDPA", dtype="float32", max_num_seqs=8)
    base = vllm_greedy(base_llm, PROMPTS, 32)
    _release(base_llm)
    llm = _llm(
        smollm2_gguf, "TORCH_SDPA", dtype="float32", max_num_seqs=8,
        num_speculative_tokens=4, **_spec_kwargs(proposer, smollm2_gguf),
    )  # fmt: skip
    spec = vllm_greedy(llm, PROMPTS, 32)
    m = llm.llm_engine.spec_decode_metrics()
    snap = llm.llm_engine.decode_step_counters()
    _release(llm)
    check_outputs_equal(base, spec, "no spec", f"spec {proposer}", PROMPTS)
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m
    if proposer == "draft":  # draft = target in float32: every proposal is accepted
        assert m["num_accepted_tokens"] == m["num_draft_tokens"], m
    assert sum(snap["graph"][0].values()) > 0, snap


@pytest.mark.forked
def test_chunked_prefill_with_draft_logprobs_close(smollm2_gguf):
    """Chunked prefill (a 16-token budget, 4 sequences at a time) with the target as its own
    draft on FLASHINFER bf16: steps with a chunk replay piecewise graphs on the target alone,
    decode-only steps speculate in graphs; logprobs-close to unchunked, no speculation."""
    base_llm = _llm(smollm2_gguf, "FLASHINFER", max_num_seqs=4)
    base = vllm_greedy(base_llm, PROMPTS, 32, logprobs=5)
    _release(base_llm)
    llm = _llm(
        smollm2_gguf, "FLASHINFER", max_num_seqs=4, num_speculative_tokens=4,
        speculative_model=smollm2_gguf, enable_chunked_prefill=True, max_num_batched_tokens=16,
    )  # fmt: skip
    spec = vllm_greedy(llm, PROMPTS, 32, logprobs=5)
    m = llm.llm_engine.spec_decode_metrics()
    snap = llm.llm_engine.decode_step_counters()
    _release(llm)
    check_logprobs_close(base, spec, "no spec", "spec chunked", PROMPTS)
    assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m
    assert sum(snap["piecewise_graph"].get(0, {}).values()) > 0, snap
    assert sum(snap["graph"].get(0, {}).values()) > 0, snap
