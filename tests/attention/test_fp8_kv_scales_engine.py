"""A checkpoint's KV-cache scales under ``--kv-cache-dtype fp8`` on CPU, end to end.

The checkpoints are the tiny Llama and Qwen2 with fp8 projections and a compressed-tensors
``quantization_config`` declaring a ``kv_cache_scheme``, plus one k_scale / v_scale per
layer, none of them 1 (Llama as ``self_attn.k_scale``, Qwen2 in older llm-compressor's
``self_attn.k_proj.output_scale`` spelling). The reference is transformers in float32 on
the dequantized weights with a cache that stores ``x / scale`` rounded to the 8-bit format
and hands ``stored * scale`` to attention (tests/attention/test_fp8_kv_cache.py's rounding
reference with scales): tokens exact, logprobs within 1e-4 (docs/design.md: CPU float32),
plain, after a prefix-cache hit and with chunked prefill. The same reference at scale 1
differs by far more, so the comparison sees the scales; ``auto`` ignores them and equals
transformers without rounding.
"""

import glob
import os

import pytest
import torch

from tests.attention.test_fp8_kv_cache import (
    MAX_TOKENS,
    PROMPTS,
    _max_logprob_gap,
    _rounded_reference,
    check_plain_cached_chunked,
)
from tests.utils import check_outputs_equal, check_top5_logprobs_within, hf_greedy, vllm_greedy

KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
# (k_scale, v_scale) per layer: the tiny Llama has 3 layers, the tiny Qwen2 2
LLAMA_SCALES = [(0.05, 3.0), (0.08, 2.0), (0.03, 4.0)]
QWEN2_SCALES = [(0.05, 3.0), (0.1, 0.5)]
SPELLINGS = {
    "k_scale": ("self_attn.k_scale", "self_attn.v_scale"),
    "output_scale": ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"),
}


def scaled_checkpoint(model_dir: str, tmp_path, scales, spelling: str) -> tuple[str, str]:
    """(fp8 checkpoint of ``model_dir`` with a kv_cache_scheme and ``scales`` stored as
    float32 tensors named per ``SPELLINGS[spelling]``, its dequantized twin)."""
    from safetensors.torch import load_file, save_file

    from tests.models.test_fp8_checkpoint import _compressed_tensors_config, _write

    qc = _compressed_tensors_config("channel", static=False)
    qc["kv_cache_scheme"] = KV_SCHEME
    fp8_dir, deq_dir = str(tmp_path / "fp8"), str(tmp_path / "deq")
    _write(model_dir, fp8_dir, deq_dir, False, qc)
    (path,) = glob.glob(os.path.join(fp8_dir, "*.safetensors"))
    tensors = load_file(path)
    for i, pair in enumerate(scales):
        for name, value in zip(SPELLINGS[spelling], pair):
            tensors[f"model.layers.{i}.{name}"] = torch.tensor([value], dtype=torch.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    return fp8_dir, deq_dir


def _as_loaded(scales) -> list[tuple[float, float]]:
    """``scales`` as the layers hold them (float32 values)."""
    return [tuple(float(torch.tensor(s, dtype=torch.float32)) for s in pair) for pair in scales]


@pytest.mark.forked
@pytest.mark.parametrize(
    "fixture,name,dtype,scales,spelling",
    [("tiny_llama_dir", "fp8", torch.float8_e4m3fn, LLAMA_SCALES, "k_scale"),
     ("tiny_qwen2_dir", "fp8_e5m2", torch.float8_e5m2, QWEN2_SCALES, "output_scale")],
)  # fmt: skip
def test_scaled_8bit_cache_equals_transformers_with_the_same_scaling(
    fixture, name, dtype, scales, spelling, request, tmp_path
):
    """The layers hold the checkpoint's scales; plain, prefix-cached (the same prompts
    again) and chunked prefill (8-token chunks) equal the scaled rounding reference, which
    differs measurably from the rounding at scale 1; ``auto`` equals transformers."""
    from vllm import LLM
    from vllm.model_executor.layers.kv_scales import kv_scales_of

    ckpt, deq = scaled_checkpoint(request.getfixturevalue(fixture), tmp_path, scales, spelling)
    scales = _as_loaded(scales)
    ref = _rounded_reference(deq, dtype, scales)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, ids
    assert _max_logprob_gap(ref, _rounded_reference(deq, dtype)) > 0.05  # the scales show

    llm = LLM(model=ckpt, device="cpu", dtype="float32", kv_cache_dtype=name)
    assert llm.apply_model(kv_scales_of) == [scales]
    check_plain_cached_chunked(llm, ckpt, name, ref, "hf-scaled")
    llm.llm_engine.shutdown()

    auto = LLM(model=ckpt, device="cpu", dtype="float32", enable_prefix_caching=False)
    assert auto.apply_model(kv_scales_of) == [scales]  # loaded, and unused
    plain = hf_greedy(deq, PROMPTS, MAX_TOKENS)
    out = vllm_greedy(auto, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(plain, out, "hf", "auto-with-scales", PROMPTS)
    check_top5_logprobs_within(plain, out, "auto-with-scales")
