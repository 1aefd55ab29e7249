"""``--quantization fp8`` (vllm/model_executor/layers/fp8.py) on CPU.

The scheme's arithmetic (row scales, e4m3 rounding bounds, zero rows, the activation
quantizer), and end to end: on CPU in float32 a quantized layer computes ``F.linear`` on
its dequantized weight, so an fp8 engine gives exactly the tokens, and the logprobs within
float32 noise, of transformers on a checkpoint whose projections were replaced by their
dequantized values (the qkv and gate_up fusions quantize row by row, so the separate HF
matrices dequantize to the same values). Refusals: fp8 with a GGUF file, other methods,
pre-quantized checkpoints.
"""

import json
import os
import re
import shutil

import pytest
import torch

from tests.utils import check_outputs_equal, check_top5_logprobs_within, hf_greedy, vllm_greedy
from vllm.model_executor.layers.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    INV_FP8_MAX,
    dequantize,
    quantize_rows,
    quantize_weight,
)

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f"]
MAX_TOKENS = 16
# the projections --quantization fp8 quantizes, by their Hugging Face names
_PROJ = re.compile(r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def test_row_scales_and_rounding():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 50, generator=gen) * torch.tensor([1e-3, 0.1, 1, 10, 100, 0])[:, None]
    wq, scale = quantize_weight(w)
    assert wq.dtype == FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == (6,)
    amax = w.abs().amax(dim=1)
    assert torch.equal(scale[:5], amax[:5] * INV_FP8_MAX) and scale[5] == 1.0  # zero row: 1
    torch.testing.assert_close(scale[:5], amax[:5] / FP8_MAX, rtol=1.2e-7, atol=0)  # 1 ulp
    deq = dequantize(wq, scale, torch.float32)
    # each row's largest value maps to 448 exactly; every value within e4m3's rounding
    # (3 mantissa bits: half an ulp is 1/16 relative; 2**-9 * scale absolute below 2**-6)
    torch.testing.assert_close(deq.abs().amax(dim=1), amax, rtol=1e-6, atol=0)
    bound = torch.maximum(w.abs() / 16, 2.0**-9 * scale[:, None])
    assert ((deq - w).abs() <= bound * 1.0001).all()
    assert not torch.equal(deq, w)  # it did round
    # a shared row maximum (a row-parallel layer's, over TP ranks) replaces the own one
    _, shared = quantize_weight(w[:, :25], amax)
    assert torch.equal(shared, scale)


def test_activation_rows():
    x = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.0], [200.0, 1.0, -1000.0]])
    xq, s = quantize_rows(x)
    assert xq.dtype == FP8_DTYPE and s.shape == (3, 1)
    assert torch.equal(
        s[:, 0], torch.tensor([3.0, 0.0, 1000.0]) * INV_FP8_MAX + torch.tensor([0, 1.0, 0])
    )
    assert xq.float()[0, 1] == -FP8_MAX and xq.float()[2, 2] == -FP8_MAX  # each row's max
    assert not xq.float()[1].any()


def _dequantized_checkpoint(model_dir: str, target: str) -> str:
    """A copy of ``model_dir`` whose projection weights are dequantize(quantize(w))."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, target)
    files = [f for f in os.listdir(target) if f.endswith(".safetensors")]
    replaced = 0
    for name in files:
        tensors = load_file(os.path.join(target, name))
        for key, w in tensors.items():
            if _PROJ.search(key):
                tensors[key] = dequantize(*quantize_weight(w), w.dtype)
                replaced += 1
        save_file(tensors, os.path.join(target, name), metadata={"format": "pt"})
    assert replaced, f"no projection weights in {model_dir}"
    return target


@pytest.mark.forked
@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_mixtral_dir"])
def test_fp8_engine_equals_transformers_on_dequantized_weights(fixture, request, tmp_path):
    """Llama; Qwen2 (q/k/v biases, tied embeddings); Mixtral (attention quantized, the
    router and the experts kept): tokens equal, top-5 logprobs within 1e-4 of
    transformers on the dequantized checkpoint, while they differ from the unquantized
    model's (so the quantization ran)."""
    from vllm import LLM

    model = request.getfixturevalue(fixture)
    ref = hf_greedy(_dequantized_checkpoint(model, str(tmp_path / "deq")), PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, f"{fixture} degenerate output {ids}"
    llm = LLM(model=model, device="cpu", dtype="float32", quantization="fp8")
    (dtypes,) = llm.apply_model(
        lambda m: [x.weight.dtype for x in m.modules() if getattr(x, "quantizable", False)]
    )
    assert dtypes and set(dtypes) == {FP8_DTYPE}
    (kept,) = llm.apply_model(lambda m: {p.dtype for p in m.parameters()} - {FP8_DTYPE})
    assert kept == {torch.float32}  # embedding, norms, lm_head (and a router, experts)
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf-dequantized", "fp8", PROMPTS)
    check_top5_logprobs_within(ref, out, "fp8", tol=1e-4)
    plain = hf_greedy(model, PROMPTS, MAX_TOKENS)
    diffs = [
        abs(a[t] - b[t])
        for (_, _, lp_a), (_, _, lp_b) in zip(plain, out)
        for a, b in zip(lp_a, lp_b)
        for t in set(a) & set(b)
    ]
    assert max(diffs) > 1e-3, "fp8 logprobs equal the unquantized model's"


def test_refusals(smollm2_gguf, tiny_llama_dir, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    def build(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config()

    with pytest.raises(ValueError, match="quantization='fp8' quantizes a Hugging Face"):
        build(smollm2_gguf, quantization="fp8")
    with pytest.raises(ValueError, match="quantization='bitsandbytes' is not supported.*'fp8'"):
        build(tiny_llama_dir, quantization="bitsandbytes")
    # GPTQ and AWQ load dequantized (tests/models/test_int_checkpoint.py): naming them needs
    # such a checkpoint
    with pytest.raises(ValueError, match="quantization='awq' names a pre-quantized format"):
        build(tiny_llama_dir, quantization="awq")
    quantized = tmp_path / "bnb"
    shutil.copytree(tiny_llama_dir, quantized)
    cfg = json.loads((quantized / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="pre-quantized weights .*quant_method='bitsandbytes'"):
        build(str(quantized))
    with pytest.raises(ValueError, match="pre-quantized"):
        build(str(quantized), quantization="fp8")
    # the refusals stop at the checkpoint: dummy weights of that config load
    assert build(str(quantized), load_format="dummy").model_config.quantization is None
    assert build(tiny_llama_dir, quantization="fp8").model_config.quantization == "fp8"


@pytest.mark.parametrize(
    "marker, method",
    [
        ("compression_config", "compressed-tensors"),
        ("hf_quant_config.json", "modelopt"),
    ],
)
def test_refuses_other_pre_quantized_markers(tiny_llama_dir, tmp_path, marker, method):
    """Pre-quantized checkpoints that say so outside ``quantization_config``, as upstream
    reads them: compressed-tensors' older ``compression_config`` key and the
    ``hf_quant_config.json`` of older ModelOpt releases. Refused in the config, naming the
    method, instead of failing in the workers on their ``weight_scale`` tensors."""
    from vllm.engine.arg_utils import EngineArgs

    quantized = tmp_path / method
    shutil.copytree(tiny_llama_dir, quantized)
    if marker == "compression_config":
        cfg = json.loads((quantized / "config.json").read_text())
        cfg["compression_config"] = {"quant_method": method, "format": "float-quantized"}
        (quantized / "config.json").write_text(json.dumps(cfg))
    else:
        stored = {"producer": {"name": method}, "quantization": {"quant_algo": "FP8"}}
        (quantized / marker).write_text(json.dumps(stored))
    for quantization in (None, "fp8"):
        args = EngineArgs(model=str(quantized), device="cpu", quantization=quantization)
        with pytest.raises(ValueError, match=f"pre-quantized weights .*'{method}' in .*{marker}"):
            args.create_engine_config()


def _load_one(name: str, shape: tuple[int, int]):
    """An ``apply_model`` callable: load one random checkpoint tensor ``name`` through the
    model's ``load_weights``; returns the ValueError's text ("" when none)."""

    def load(model):
        try:
            model.load_weights([(name, torch.randn(shape))])
        except ValueError as e:
            return str(e)
        return ""

    return load


@pytest.mark.forked
def test_weights_cannot_be_loaded_into_a_quantized_model(tiny_llama_dir):
    """``load_weights`` after quantization (through ``apply_model``) is a ValueError naming
    the quantized parameter, for a plain weight (down_proj) and a fused one (q of
    qkv_proj), and leaves the fp8 weights as they were. Guards a plain copy, which cast
    the new values to e4m3 under the old row scales (or failed on the shard argument)."""
    from vllm import LLM

    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", quantization="fp8")
    (before,) = llm.apply_model(lambda m: m.model.layers[0].mlp.down_proj.weight.float().clone())
    for name, param, shape in [
        ("model.layers.0.mlp.down_proj.weight", "mlp.down_proj.weight", (64, 128)),
        ("model.layers.0.self_attn.q_proj.weight", "self_attn.qkv_proj.weight", (64, 64)),
    ]:
        (message,) = llm.apply_model(_load_one(name, shape))
        assert f"model.layers.0.{param} is quantized to float8_e4m3fn" in message
    (after,) = llm.apply_model(lambda m: m.model.layers[0].mlp.down_proj.weight.float().clone())
    assert torch.equal(before, after)


def test_startup_summary_names_fp8():
    """The start-up summary line ends with what holds fp8 weights (or that an fp8
    checkpoint was dequantized), and says nothing without quantization."""
    from types import SimpleNamespace

    from vllm.worker.startup_summary import _quantization

    def config(quantization, stored=None, dequantized=None):
        mc = SimpleNamespace(
            quantization=quantization,
            checkpoint_quantization=stored,
            checkpoint_dequantized=dequantized,
        )
        return SimpleNamespace(model_config=mc)

    assert _quantization(config(None)) == ""
    assert _quantization(config("fp8")) == ", quantization=fp8 (decoder projections; on load)"
    assert _quantization(config("fp8", "fbgemm_fp8")).endswith("; fbgemm_fp8)")
    block = "fp8, block-wise scales"  # an fp8 checkpoint loaded dequantized
    assert _quantization(config(None, dequantized=block)) == (
        ", quantization=none (fp8 checkpoint dequantized: fp8, block-wise scales)"
    )
    assert _quantization(config("fp8", dequantized=block)).endswith(
        "(decoder projections; on load, of the fp8 checkpoint dequantized: fp8, block-wise scales)"
    )
