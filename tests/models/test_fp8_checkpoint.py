"""Pre-quantized fp8 checkpoints (vllm/model_executor/layers/fp8_checkpoint.py) on CPU.

The checkpoints are written here from a tiny Llama the way llm-compressor and fbgemm write
theirs: e4m3 projection weights, ``weight_scale`` per row ([N, 1]) or per tensor ([1]),
static ``input_scale`` tensors for a static-activation scheme, and the config's
``quantization_config``. In float32 on CPU the engine equals transformers on the
dequantized weights exactly (tokens; logprobs within 1e-4), as online fp8 does
(tests/models/test_fp8.py).
"""

import json
import os
import pathlib
import shutil

import pytest
import torch

from tests.models.test_fp8 import _PROJ, PROMPTS
from tests.utils import (
    check_outputs_equal,
    check_top5_logprobs_within,
    hf_greedy,
    stage_start_method,
    vllm_greedy,
)
from vllm.model_executor.layers.fp8 import FP8_DTYPE, dequantize, quantize_weight

MAX_TOKENS = 16


def _compressed_tensors_config(strategy: str, static: bool) -> dict:
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static,
            "strategy": "tensor" if static else "token"}  # fmt: skip
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": strategy}  # fmt: skip
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}
        },
        "ignore": ["lm_head"],
    }


def _write(
    model_dir: str,
    fp8_dir: str,
    deq_dir: str,
    per_tensor: bool,
    qc: dict,
    keep: str | None = None,
    bf16: str | None = None,
    kv_scales: bool = False,
    zero_points: bool = False,
) -> None:
    """An fp8 checkpoint of ``model_dir`` at ``fp8_dir`` (with ``qc`` as its
    quantization_config; per-tensor scales come with static ``input_scale`` tensors) and
    the same values dequantized at ``deq_dir``. Projections whose name matches the regex
    ``keep`` stay unquantized (as the config's ``ignore`` says), those matching ``bf16``
    are stored as bfloat16 (a broken checkpoint); ``kv_scales`` adds each layer's
    ``self_attn.k_scale`` / ``v_scale`` (a ``kv_cache_scheme``'s), ``zero_points`` the
    zero ``weight_zero_point`` / ``input_zero_point`` older compressed-tensors wrote."""
    import re

    def convert(key: str, w: torch.Tensor) -> tuple[dict, torch.Tensor]:
        fp8 = {key: w}
        if key.endswith("self_attn.o_proj.weight") and kv_scales:
            for kv in ("k_scale", "v_scale"):
                fp8[key.replace("o_proj.weight", kv)] = torch.tensor(0.02)
        if not _PROJ.search(key) or (keep and re.search(keep, key)):
            return fp8, w
        amax = w.abs().amax().expand(w.shape[0]) if per_tensor else None
        wq, scale = quantize_weight(w, amax)  # scale [N]
        fp8[key] = w.to(torch.bfloat16) if bf16 and re.search(bf16, key) else wq
        stem = key[: -len(".weight")]
        fp8[stem + ".weight_scale"] = scale[:1] if per_tensor else scale[:, None]
        if zero_points:
            for zp in ("weight_zero_point", "input_zero_point"):
                fp8[f"{stem}.{zp}"] = torch.zeros(scale.shape[:1], dtype=FP8_DTYPE)
        if per_tensor:  # the static scheme's activation scale
            fp8[stem + ".input_scale"] = torch.tensor([0.05])
        return fp8, dequantize(wq, scale, w.dtype)

    write_twins(model_dir, fp8_dir, deq_dir, convert)
    _set_quantization_config(fp8_dir, qc)


def write_twins(model_dir: str, fp8_dir: str, deq_dir: str, convert) -> None:
    """Copy ``model_dir`` to ``fp8_dir`` and ``deq_dir``, rewriting each safetensors tensor
    ``w`` of name ``key``: ``convert(key, w)`` returns the tensors ``fp8_dir`` stores for it
    ({name: tensor}: the weight and its scales) and the value ``deq_dir`` stores."""
    from safetensors.torch import load_file, save_file

    for target in (fp8_dir, deq_dir):
        shutil.copytree(model_dir, target)
    for name in [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]:
        fp8, deq = {}, {}
        for key, w in load_file(os.path.join(model_dir, name)).items():
            stored, deq[key] = convert(key, w)
            fp8.update(stored)
        save_file(fp8, os.path.join(fp8_dir, name), metadata={"format": "pt"})
        save_file(deq, os.path.join(deq_dir, name), metadata={"format": "pt"})


def _set_quantization_config(model_dir, qc: dict, key: str = "quantization_config") -> None:
    """Write ``qc`` as the ``key`` (quantization_config) of ``model_dir``'s config.json."""
    path = pathlib.Path(model_dir, "config.json")
    cfg = json.loads(path.read_text())
    cfg[key] = qc
    path.write_text(json.dumps(cfg))


@pytest.mark.forked
@pytest.mark.parametrize(
    "case",
    ["compressed-tensors-tensor-static", "fp8-tensor-static", "fbgemm_fp8-channel-explicit-tp2"],
)
def test_fp8_checkpoint_equals_transformers_on_dequantized_weights(
    case, tiny_llama_dir, tmp_path, monkeypatch
):
    """compressed-tensors and AutoFP8's fp8 (its unquantized modules in ``ignored_layers``)
    with per-tensor weight scales and static input scales (unused: activations are scaled
    per token), loaded without a flag; fbgemm_fp8 with per-row
    scales, named by ``quantization="fbgemm_fp8"``, at TP = 2 (each rank reads its rows'
    scales of q/k/v and gate/up, and whole rows' of o and down; an all-reduce sums in
    another order, hence logprobs within 1e-4 rather than exact)."""
    from vllm import LLM

    per_tensor = "-tensor-" in case
    if case.startswith("compressed"):
        qc = _compressed_tensors_config("tensor", static=True)
    elif case.startswith("fp8"):
        qc = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    else:
        qc = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
              "modules_to_not_convert": ["lm_head"]}  # fmt: skip
    fp8_dir, deq_dir = str(tmp_path / "fp8"), str(tmp_path / "deq")
    _write(tiny_llama_dir, fp8_dir, deq_dir, per_tensor, qc)
    ref = reference(deq_dir)
    kw = {} if per_tensor else {"quantization": "fbgemm_fp8", "tensor_parallel_size": 2}
    # the reference ran torch CPU ops in this process (stage_start_method: fork only
    # where that is safe)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    llm = LLM(model=fp8_dir, device="cpu", dtype="float32", **kw)
    mc = llm.llm_engine.config.model_config
    assert (mc.quantization, mc.checkpoint_quantization) == ("fp8", qc["quant_method"])
    scales = llm.apply_model(_distinct_scales)[0]
    # per tensor: qkv holds 3 values (q, k, v), gate_up 2, o and down 1; per row: many
    assert (max(scales) <= 3) == per_tensor, scales
    check_against(llm, ref, case)


def reference(deq_dir: str) -> list:
    """Transformers' greedy outputs (with top-5 logprobs) on the dequantized checkpoint,
    each with at least 4 distinct tokens (docs/design.md: a repeating model proves
    nothing)."""
    ref = hf_greedy(deq_dir, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:
        assert len(set(ids)) >= 4, f"degenerate output {ids}"
    return ref


def check_against(llm, ref: list, name: str) -> None:
    """The engine's greedy tokens equal ``ref``'s and its top-5 logprobs are within 1e-4
    (float32 on CPU); shuts the engine down."""
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf-dequantized", name, PROMPTS)
    check_top5_logprobs_within(ref, out, name, tol=1e-4)
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_fp8_checkpoint_with_unquantized_modules(tiny_llama_dir, tmp_path):
    """A config keeping modules unquantized, as real ones do: ``ignore`` by ``re:``
    patterns (lm_head; layer 0's attention, its q/k/v stored apart) and by name (layer 1's
    down_proj), with a ``kv_cache_scheme`` and its ``k_scale`` / ``v_scale`` tensors (unused)
    and llm-compressor's other keys, and the zero zero points older releases wrote: those
    layers load dense, the rest in fp8, and the engine equals transformers on the
    dequantized weights. A checkpoint keeping only part of a fused layer unquantized, or
    storing a weight its config quantizes in bf16, is refused naming the layer."""
    from vllm import LLM

    qc = _compressed_tensors_config("channel", static=False)
    kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    ignore = ["re:.*lm_head", r"re:model\.layers\.0\.self_attn\.", "model.layers.1.mlp.down_proj"]
    qc.update(ignore=ignore, kv_cache_scheme=kv, quantization_status="compressed",
              sparsity_config={}, version="0.9.1")  # fmt: skip
    fp8_dir, deq_dir = str(tmp_path / "fp8"), str(tmp_path / "deq")
    keep = r"layers\.0\.self_attn\.|layers\.1\.mlp\.down_proj"
    _write(tiny_llama_dir, fp8_dir, deq_dir, False, qc, keep, kv_scales=True, zero_points=True)
    ref = hf_greedy(deq_dir, PROMPTS, MAX_TOKENS)
    llm = LLM(model=fp8_dir, device="cpu", dtype="float32")
    # 3 layers x (qkv, o, gate_up, down), 3 of them dense
    assert llm.apply_model(_fp8_layers)[0] == (9, 12)
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf-dequantized", "fp8-ignore", PROMPTS)
    llm.llm_engine.shutdown()
    del llm
    qc["ignore"] = ["lm_head", "model.layers.0.self_attn.q_proj"]
    part = str(tmp_path / "part")
    _write(tiny_llama_dir, part, part + "-deq", False, qc, keep=r"layers\.0\.self_attn\.q_proj")
    with pytest.raises(ValueError, match=r"keeps \['model.layers.0.self_attn.q_proj'\] .* fused"):
        LLM(model=part, device="cpu", dtype="float32")
    qc["ignore"] = ["lm_head"]
    bf16 = str(tmp_path / "bf16")
    _write(tiny_llama_dir, bf16, bf16 + "-deq", False, qc, bf16=r"layers\.1\.mlp\.up_proj")
    with pytest.raises(
        ValueError, match=r"'model.layers.1.mlp.gate_up_proj' \(part 1\) .*bfloat16"
    ):
        LLM(model=bf16, device="cpu", dtype="float32")


def _distinct_scales(model) -> list[int]:
    """Distinct scale values of each fp8 layer of ``model`` (a function, so the mp
    executor can send it to the ranks)."""
    return [
        m.weight_scale.unique().numel() for m in model.modules() if getattr(m, "quantizable", 0)
    ]


def _fp8_layers(model) -> tuple[int, int]:
    """(fp8 layers, quantizable layers) of ``model``."""
    layers = [m for m in model.modules() if getattr(m, "quantizable", 0)]
    return sum(m.weight_scale is not None for m in layers), len(layers)


def _with_config(model_dir: str, target, qc: dict, key: str = "quantization_config") -> str:
    shutil.copytree(model_dir, target)
    _set_quantization_config(target, qc, key)
    return str(target)


def test_fp8_checkpoint_refusals(tiny_llama_dir, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    def build(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config()

    int8 = _compressed_tensors_config("channel", static=False)
    int8["config_groups"]["group_0"]["weights"]["type"] = "int"
    with pytest.raises(ValueError, match=r"weights \(type, bits, strategy\) = \('int', 8"):
        build(_with_config(tiny_llama_dir, tmp_path / "int8", int8))
    head = _compressed_tensors_config("channel", static=False)
    head["ignore"] = []
    with pytest.raises(ValueError, match="a quantized lm_head"):
        build(_with_config(tiny_llama_dir, tmp_path / "head", head))
    fbgemm = {"quant_method": "fbgemm_fp8"}
    legacy = _compressed_tensors_config("channel", static=False)  # early releases' key:
    legacy = _with_config(tiny_llama_dir, tmp_path / "legacy", legacy, "compression_config")
    assert build(legacy).model_config.checkpoint_quantization == "compressed-tensors"
    ok = _with_config(tiny_llama_dir, tmp_path / "ok", fbgemm)
    with pytest.raises(ValueError, match="'compressed-tensors' does not match .*'fbgemm_fp8'"):
        build(ok, quantization="compressed-tensors")
    with pytest.raises(ValueError, match="names a pre-quantized format, but .* no quantization"):
        build(tiny_llama_dir, quantization="fbgemm_fp8")
    assert build(ok, quantization="fp8").model_config.checkpoint_quantization == "fbgemm_fp8"
    sparse = _compressed_tensors_config("channel", static=False)
    sparse["sparsity_config"] = {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}
    with pytest.raises(ValueError, match="sparsity_config format 'sparse-24-bitmask'"):
        build(_with_config(tiny_llama_dir, tmp_path / "sparse", sparse))
    # dummy weights of an fp8 checkpoint's shape: quantized on load, as the checkpoint's
    for kw in ({}, {"quantization": "fbgemm_fp8"}):
        mc = build(ok, load_format="dummy", **kw).model_config
        assert (mc.quantization, mc.checkpoint_quantization) == ("fp8", None)
