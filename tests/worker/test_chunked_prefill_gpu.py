"""Chunked prefill on a real GPU (bf16, CUDA graphs on; marked ``gpu``): a batch whose long
prompt is chunked in beside running decodes is logprobs-close to the unchunked run (chunks
attend to their context through the paged cache and share steps with decode rows: other
kernel shapes), steps with chunks and decode rows run eagerly as "mixed" when piecewise
graphs are off (with them, the default for chunked prefill on CUDA, they replay pieces),
decode-only steps still replay graphs, and on FLASHINFER the mixed steps ran its paged
prefill wrapper; with multi-step decoding as well, the run stays logprobs-close."""

import gc
import os

import pytest

from tests.utils import check_logprobs_close, vllm_greedy

pytestmark = pytest.mark.gpu

LONG = "You are a helpful assistant. Answer briefly and precisely. " * 48  # ~600 tokens
PROMPTS = ["The capital of France is", "Hello, my name is", "def fibonacci(n):",
           LONG + "Q: Name a planet. A:", "Once upon a time,"]  # fmt: skip


def _run(model, backend, chunked, pad_eager=False, **extra):
    os.environ["VLLM_ATTENTION_BACKEND"] = backend
    from vllm import LLM

    kw = dict(enable_chunked_prefill=True, max_num_batched_tokens=64) if chunked else {}
    llm = LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
              max_num_seqs=8, small_decode_max_rows=0, **kw, **extra)  # fmt: skip
    runner = llm.llm_engine.executor.worker.model_runner
    runner.pad_eager_batches = pad_eager
    be = runner.attn_backend
    prefill_before = getattr(be, "prefill_runs", 0)
    out = vllm_greedy(llm, PROMPTS, 24, logprobs=5)
    counters = llm.llm_engine.decode_step_counters()
    prefill_runs = getattr(be, "prefill_runs", 0) - prefill_before
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return out, counters, prefill_runs


@pytest.mark.forked
@pytest.mark.parametrize("backend", ["FLASHINFER", "TORCH_SDPA"])
def test_chunked_close_to_unchunked_and_counters(smollm2_gguf, backend):
    ref, ref_counters, _ = _run(smollm2_gguf, backend, False)
    got, counters, prefill_runs = _run(smollm2_gguf, backend, True, piecewise_graph_max_tokens=0)
    check_logprobs_close(ref, got, "unchunked", "chunked", PROMPTS)
    assert ref[0][1].startswith(" Paris"), ref[0][1]
    mixed = counters["eager"].get(0, {}).get("mixed", 0)
    assert mixed >= 5, counters  # ~540 tokens in chunks of at most 64 beside decode rows
    assert "mixed" not in ref_counters["eager"].get(0, {}), ref_counters
    assert sum(counters["graph"].get(0, {}).values()) > 0, counters  # decode-only steps
    if backend == "FLASHINFER":
        assert prefill_runs >= mixed  # every mixed step planned the paged prefill wrapper


@pytest.mark.forked
def test_piecewise_graphs_equal_eager_pieces(smollm2_gguf):
    """--piecewise-graph-max-tokens 64 on FLASHINFER: the chunked run replays pieces for
    every prefill and mixed step (none runs eagerly), equals bit for bit the same run with
    enforce_eager and the eager padding switch (the same pieces and padded decode batches,
    uncaptured), and is logprobs-close to the unchunked run."""
    pieces = dict(piecewise_graph_max_tokens=64)
    ref, _, _ = _run(smollm2_gguf, "FLASHINFER", False)
    got, counters, _ = _run(smollm2_gguf, "FLASHINFER", True, **pieces)
    eager, eager_counters, _ = _run(smollm2_gguf, "FLASHINFER", True, pad_eager=True,
                                    enforce_eager=True, **pieces)  # fmt: skip
    assert got == eager
    check_logprobs_close(ref, got, "unchunked", "chunked with pieces", PROMPTS)
    replays = sum(counters["piecewise_graph"].get(0, {}).values())
    assert replays >= 5, counters  # ~540 prompt tokens in steps of at most 64 tokens
    assert counters["eager"].get(0, {}) == {}, counters
    assert eager_counters["eager"][0]["mixed"] >= 5, eager_counters


@pytest.mark.forked
def test_chunked_with_multi_step_close_to_unchunked(smollm2_gguf):
    """Chunked prefill with 8 scheduler steps on FLASHINFER (pieces on, the default): the
    steps with chunks replay pieces one pass at a time, decode-only calls replay decode
    graphs for up to 8 passes, and the run is logprobs-close to the unchunked one-step run."""
    ref, _, _ = _run(smollm2_gguf, "FLASHINFER", False)
    got, counters, _ = _run(smollm2_gguf, "FLASHINFER", True, num_scheduler_steps=8)
    check_logprobs_close(ref, got, "unchunked", "chunked, 8 steps", PROMPTS)
    assert sum(counters["piecewise_graph"].get(0, {}).values()) >= 5, counters
    assert sum(counters["graph"].get(0, {}).values()) > 0, counters
    assert counters["eager"].get(0, {}) == {}, counters
