"""``--quantization fp8`` on a GPU (marked ``gpu``; skipped without CUDA).

SmolLM2 (the GGUF's weights as a Hugging Face directory, tests/utils.gguf_reference_dir)
in bfloat16 on FLASHINFER: the projections are fp8; one-sequence decode steps run the
fused GEMV kernels on the fp8 weights, batched steps and prefills W8A8
``torch._scaled_mm`` (vllm/model_executor/layers/fp8.py). Comparisons (docs/design.md):
vs transformers in bfloat16 on the dequantized weights -> check_logprobs_close (the
activations are quantized too on the W8A8 path); CUDA graphs vs --enforce-eager with the
same batches -> exact.
"""

import pytest

from tests.models.test_fp8 import _dequantized_checkpoint
from tests.utils import (
    SMOLLM2_PROMPTS,
    check_logprobs_close,
    check_outputs_equal,
    gguf_reference_dir,
    hf_greedy,
    vllm_greedy,
)

pytestmark = pytest.mark.gpu

MAX_TOKENS = 32


def _run(model: str, monkeypatch, **kw):
    """(batched outputs, first prompt alone, {path: calls}) of an fp8 engine, shut down."""
    import os

    from vllm import LLM
    from vllm.kernels import gemv
    from vllm.model_executor.layers import fp8

    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"
    calls = {"gemv": 0, "w8a8": 0}
    launch, quantize_rows = gemv._launch, fp8.quantize_rows

    def counted_launch(*args, **kwargs):
        calls["gemv"] += kwargs.get("weight_scale") is not None
        return launch(*args, **kwargs)

    def counted_rows(x):
        calls["w8a8"] += 1
        return quantize_rows(x)

    monkeypatch.setattr(gemv, "_launch", counted_launch)
    monkeypatch.setattr(fp8, "quantize_rows", counted_rows)
    llm = LLM(model=model, device="cuda", dtype="bfloat16", quantization="fp8",
              gpu_memory_utilization=0.3, max_num_seqs=16, **kw)  # fmt: skip
    try:
        (dtypes,) = llm.apply_model(lambda m: {str(p.dtype) for p in m.parameters()})
        assert "torch.float8_e4m3fn" in dtypes, dtypes
        batched = vllm_greedy(llm, SMOLLM2_PROMPTS, MAX_TOKENS, logprobs=5)
        alone = vllm_greedy(llm, SMOLLM2_PROMPTS[:1], MAX_TOKENS, logprobs=5)
        counters = llm.llm_engine.decode_step_counters()
    finally:
        llm.llm_engine.shutdown()
    return batched, alone, calls, counters


@pytest.mark.forked
def test_smollm2_fp8_close_to_transformers_and_graphs_equal_eager(
    smollm2_gguf, tmp_path, monkeypatch
):
    """Graphs: logprobs-close to transformers on the dequantized weights, batched and
    alone (" Paris" first); graph replays counted. Eager: the same tokens exactly, and
    both fp8 paths seen running (the GEMV kernels with scales, W8A8)."""
    hf_dir = gguf_reference_dir(smollm2_gguf)
    ref = hf_greedy(
        _dequantized_checkpoint(hf_dir, str(tmp_path / "deq")),
        SMOLLM2_PROMPTS, MAX_TOKENS, dtype="bfloat16", device="cuda",
    )  # fmt: skip
    graph, graph_alone, _, counters = _run(hf_dir, monkeypatch)
    check_logprobs_close(ref, graph, "hf-dequantized", "fp8-graphs", SMOLLM2_PROMPTS)
    check_logprobs_close(ref[:1], graph_alone, "hf-dequantized", "fp8-graphs-alone")
    assert graph[0][1].startswith(" Paris"), graph[0][1]
    assert sum(counters["graph"][0].values()) > 0, counters
    eager, eager_alone, calls, counters = _run(hf_dir, monkeypatch, enforce_eager=True)
    assert counters["graph"] == {}, counters
    assert calls["gemv"] > 0 and calls["w8a8"] > 0, calls
    check_outputs_equal(graph, eager, "fp8-graphs", "fp8-eager", SMOLLM2_PROMPTS)
    check_outputs_equal(graph_alone, eager_alone, "fp8-graphs-alone", "fp8-eager-alone")
