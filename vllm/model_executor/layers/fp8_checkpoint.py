"""Checkpoints already quantized to fp8: which formats load, and the parameters they load into.

A checkpoint whose ``config.json`` holds a ``quantization_config`` (or the older
``compression_config``; see :func:`stored_quantization`) stores its projections
as ``float8_e4m3fn`` with scales. Three formats fit this engine's fp8 layers
(vllm/model_executor/layers/fp8.py: e4m3 weights, a float32 scale per output row, dynamic
per-token activation scales):

- ``quant_method: "compressed-tensors"`` (llm-compressor's ``FP8`` / ``FP8_DYNAMIC``
  schemes, the "-FP8" and "-FP8-dynamic" checkpoints): one config group targeting
  ``Linear`` with 8-bit float symmetric weights, ``strategy`` ``"channel"`` (``weight_scale``
  [N, 1]) or ``"tensor"`` (one scale a matrix, repeated over its rows here), format
  ``float-quantized`` or ``naive-quantized``. Input activations may be dynamic per token
  (as here) or static per tensor (``input_scale``): static scales are not used, the
  activations are scaled per token as with ``--quantization fp8``. KV-cache scales
  (``kv_cache_scheme``: ``k_scale`` / ``v_scale`` tensors) load into the attention layers
  (vllm/model_executor/layers/kv_scales.py): an 8-bit cache (``--kv-cache-dtype fp8``)
  stores keys and values divided by them, a cache of the model's dtype ignores them
  (vllm/attention/kv_cache_dtype.py; the engine says which, see :func:`kv_cache_scheme`).
- ``quant_method: "fbgemm_fp8"`` (Meta's FP8 releases): per-row ``weight_scale`` [N, 1],
  dynamic per-token activations.
- ``quant_method: "fp8"`` without ``weight_block_size`` (AutoFP8's checkpoints): one
  ``weight_scale`` per tensor, static or dynamic activations (``input_scale`` unused).

Modules the config keeps unquantized (compressed-tensors' ``ignore``, fbgemm_fp8's and
fp8's ``modules_to_not_convert``, AutoFP8's ``ignored_layers``: Hugging Face module names,
or ``re:`` regular expressions, such as Meta's FP8 releases' attention layers) load in the
model's dtype; a fused layer (qkv, gate_up) needs all or none of its parts kept so.

Two kinds load dequantized to the model's dtype instead (no fp8 kernel here for them;
vllm/model_executor/layers/fp8_dequant.py): block-wise scales (``quant_method: "fp8"``
with ``weight_block_size``, DeepSeek's and Qwen3's "-FP8" releases, or compressed-tensors'
``strategy: "block"``) and mixture-of-experts models (their experts run in the model's
dtype here).

A compressed-tensors config that quantizes only the KV cache (a ``kv_cache_scheme`` and no
``config_groups``, or an empty one: llm-compressor's "KV cache only" FP8 recipes) loads as
upstream loads it: the weights as stored, in the model's dtype, and the ``k_scale`` /
``v_scale`` tensors into the attention layers (:attr:`Fp8Checkpoint.kv_cache_only`).

GPTQ and AWQ checkpoints are not fp8 ones: vllm/model_executor/layers/int_checkpoint.py
decides how they load (dequantized) before :func:`checkpoint_fp8_method` is asked.

Refused, naming what is supported: other integer or 4-bit schemes (W8A8-int8, ...),
sparse weights (a ``sparsity_config`` format other than ``dense``), a KV-cache scheme other
than 8-bit float per tensor, a quantized ``lm_head`` among fp8 layers and ModelOpt's
format, KV-cache-only ModelOpt configs (``kv_cache_quant_algo`` without a weight
``quant_algo``) included: upstream refuses those too, for their missing ``quant_algo``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch
from torch import nn

from vllm.model_executor.layers.fp8 import FP8_DTYPE
from vllm.model_executor.layers.fp8_dequant import SCALE_SUFFIXES, is_fp8, stored_dtype
from vllm.model_executor.layers.kv_scales import kv_scale_target
from vllm.model_executor.weight_utils import as_tensor

# quantization_config.quant_method values that --quantization may name (its "fp8" quantizes
# on load, and also matches a checkpoint of quant_method "fp8")
CHECKPOINT_METHODS = ("compressed-tensors", "fbgemm_fp8")
# every quant_method of an fp8 checkpoint this engine loads
FP8_METHODS = ("fp8", *CHECKPOINT_METHODS)
# checkpoint tensors nothing here reads: static activation scales (activations are scaled
# per token), output activation scales but the k / v projections' (older llm-compressor
# releases' KV-cache scales, which load: see is_unused_tensor) and the zero points older
# compressed-tensors releases wrote (all zeros: symmetric weights)
UNUSED_SUFFIXES = (".input_scale", ".output_scale", "_zero_point")


def is_unused_tensor(name: str) -> bool:
    """Whether checkpoint tensor ``name`` is one nothing here reads (:data:`UNUSED_SUFFIXES`);
    KV-cache scales (``kv_scales.kv_scale_target``) are read, whatever their spelling."""
    return name.endswith(UNUSED_SUFFIXES) and kv_scale_target(name) is None


@dataclass(frozen=True)
class Fp8Checkpoint:
    """How a pre-quantized fp8 checkpoint loads.

    Attributes:
        method: its ``quant_method`` (one of :data:`FP8_METHODS`).
        dequantized: None when its projections load as fp8 layers; else why its weights
            are dequantized to the model's dtype on load ("block-wise scales",
            "mixture of experts"; vllm/model_executor/layers/fp8_dequant.py).
        block: (bn, bk), the tile of block-wise scales, else None.
        kv_cache_only: the config quantizes only the KV cache: the weights load as stored
            (the model's dtype), only its KV-cache scales are read.
    """

    method: str
    dequantized: str | None = None
    block: tuple[int, int] | None = None
    kv_cache_only: bool = False


def _field(cfg, name: str, default=None):
    """``cfg[name]`` of a dict or ``cfg.name`` of a transformers config object."""
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def stored_quantization(hf_config, model: str) -> tuple[str, object] | None:
    """Where a checkpoint says its weights are pre-quantized, and what it says, or None.

    Read as upstream reads them: ``quantization_config`` in config.json, else
    ``compression_config`` (compressed-tensors' older key, the same fields), else the
    ``hf_quant_config.json`` that older ModelOpt releases write beside the weights
    (``{"quant_method": <its producer.name>}`` stands for it).

    Returns:
        (where, e.g. "its config's quantization_config"; the config dict or object).
    """
    for key in ("quantization_config", "compression_config"):
        stored = getattr(hf_config, key, None)
        if stored is not None:
            return f"its config's {key}", stored
    path = os.path.join(model, "hf_quant_config.json")
    if os.path.isfile(path):
        try:
            with open(path) as f:
                producer = json.load(f)["producer"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            producer = "modelopt"
        return "its hf_quant_config.json", {"quant_method": producer}
    return None


def kv_cache_scheme(hf_config, model: str):
    """The KV-cache quantization a checkpoint declares (compressed-tensors'
    ``kv_cache_scheme``, whose ``k_scale`` / ``v_scale`` tensors an 8-bit cache applies,
    vllm/model_executor/layers/kv_scales.py), or None."""
    stored = stored_quantization(hf_config, model)
    return None if stored is None else _field(stored[1], "kv_cache_scheme")


def unquantized_modules(qc) -> list[str]:
    """The modules a quantization config keeps unquantized (compressed-tensors' ``ignore``,
    ``modules_to_not_convert`` of fbgemm_fp8 and Hugging Face's fp8, AutoFP8's
    ``ignored_layers``), as written: names or ``re:`` patterns."""
    keys = ("ignore", "modules_to_not_convert", "ignored_layers")
    return [m for key in keys for m in (_field(qc, key) or [])]


def is_unquantized(name: str, patterns) -> bool:
    """Whether module ``name`` (Hugging Face naming: ``model.layers.0.self_attn.q_proj``)
    matches one of ``patterns``: ``re:PATTERN`` matched from the start of the name (as
    compressed-tensors does), or a name equal to it or a parent module's."""
    return any(
        re.match(p[3:], name) if p.startswith("re:") else name == p or name.startswith(p + ".")
        for p in patterns
    )


def _refuse(model: str, method, why: str, where: str) -> ValueError:
    return ValueError(
        f"{model!r} holds pre-quantized weights (quant_method={method!r} in {where}): "
        f"{why}. Pre-quantized checkpoints load when they are fp8 with a scale per output "
        "row, per tensor or per block (compressed-tensors FP8 / FP8_DYNAMIC / FP8_BLOCK, "
        "fbgemm_fp8, fp8), or when a compressed-tensors config quantizes only the KV cache "
        "(a kv_cache_scheme without config_groups), and GPTQ (4 or 8 bits) and AWQ "
        "(4-bit GEMM) checkpoints load dequantized; otherwise use the unquantized "
        "checkpoint, which --quantization fp8 quantizes on load."
    )


def checkpoint_fp8_method(model: str, hf_config, moe: bool) -> Fp8Checkpoint | None:
    """How a pre-quantized fp8 checkpoint (:func:`stored_quantization`) loads, or None for
    an unquantized one; a compressed-tensors config quantizing only the KV cache gives
    ``kv_cache_only`` (its weights load as stored).

    Args:
        model: the checkpoint's path (for messages and ``hf_quant_config.json``).
        hf_config: its transformers config.
        moe: whether the architecture is a mixture of experts.

    Raises:
        ValueError: a quantization this engine cannot load (module docstring), naming the
            method, where the checkpoint says so and the reason.
    """
    stored = stored_quantization(hf_config, model)
    if stored is None:
        return None
    where, qc = stored
    method = _field(qc, "quant_method")
    if isinstance(method, str) and method.lower().startswith("modelopt"):
        why = (
            "ModelOpt's format is not supported, a KV-cache-only config (kv_cache_quant_algo "
            "without a weight quant_algo) included"
        )
        raise _refuse(model, method, why, where)
    if method not in FP8_METHODS:
        raise _refuse(model, method, "this method is not supported", where)
    if method == "compressed-tensors":
        why = _compressed_tensors_problem(qc)
        if why is not None:
            raise _refuse(model, method, why, where)
        if not _field(qc, "config_groups"):  # a kv_cache_scheme alone (else refused above)
            return Fp8Checkpoint(method, kv_cache_only=True)
    block = _weight_block(qc)
    if block is not None and not (
        len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise _refuse(model, method, f"a block size of {list(block)} (two positive ints)", where)
    if block is not None:
        return Fp8Checkpoint(method, "block-wise scales", tuple(block))
    if moe:
        return Fp8Checkpoint(method, "mixture of experts")
    lm_head_kept = is_unquantized("lm_head", unquantized_modules(qc))
    if method == "compressed-tensors" and not lm_head_kept:
        raise _refuse(model, method, "a quantized lm_head (not in 'ignore')", where)
    return Fp8Checkpoint(method)


def fp8_layer_tensors(weights, model: str, hf_config):
    """The checkpoint's ``(name, tensor)`` items an fp8-layer model reads: without the
    tensors no layer reads (:func:`is_unused_tensor`), refusing a quantized ``lm_head`` (an
    fp8 ``lm_head.weight`` or an ``lm_head`` scale) as :func:`checkpoint_fp8_method`
    refuses compressed-tensors' from its config (fp8's and fbgemm_fp8's configs do not
    say whether lm_head is quantized).

    Raises:
        ValueError: a quantized lm_head, naming the tensor and the method.
    """
    for name, loaded in weights:
        if is_unused_tensor(name):
            continue
        if name.startswith("lm_head.") and (
            name.endswith(SCALE_SUFFIXES) or (name == "lm_head.weight" and is_fp8(loaded))
        ):
            where, qc = stored_quantization(hf_config, model)
            why = f"a quantized lm_head (checkpoint tensor {name!r})"
            raise _refuse(model, _field(qc, "quant_method"), why, where)
        yield name, loaded


def _weight_block(qc) -> list | None:
    """The scale tile of a block-wise config: fp8's ``weight_block_size`` or the weights'
    ``block_structure`` of a compressed-tensors ``strategy: "block"`` group ([N, M], or
    the string "NxM" older compressed-tensors releases write); else None."""
    block = _field(qc, "weight_block_size")
    if block:
        return _block_list(block)
    for group in (_field(qc, "config_groups") or {}).values():
        weights = _field(group, "weights") or {}
        if _field(weights, "strategy") == "block":
            return _block_list(_field(weights, "block_structure") or [])
    return None


def _block_list(block) -> list:
    """A block size as a list: "128x128" -> [128, 128]; a string that is not "NxM" stays
    whole ([value]), for the refusal to name it."""
    if isinstance(block, str):
        try:
            return [int(b) for b in block.lower().split("x")]
        except ValueError:
            return [block]
    return list(block)


def _compressed_tensors_problem(qc) -> str | None:
    """Why a compressed-tensors config is not one this engine loads, or None: one fp8
    config group (module docstring), or none with a ``kv_cache_scheme`` (KV cache only)."""
    sparsity = _field(_field(qc, "sparsity_config") or {}, "format")
    if sparsity not in (None, "dense"):
        return f"sparsity_config format {sparsity!r} (sparse weights)"
    kv = _field(qc, "kv_cache_scheme")
    if kv is not None:
        kv_scheme = (_field(kv, "type"), _field(kv, "num_bits"), _field(kv, "strategy"))
        if kv_scheme[:2] != ("float", 8) or kv_scheme[2] not in (None, "tensor"):
            return f"kv_cache_scheme (type, bits, strategy) = {kv_scheme} (8-bit float, per tensor)"
    groups = _field(qc, "config_groups") or {}
    if not groups and kv is not None:
        return None  # KV cache only: the weights are not quantized
    if len(groups) != 1:
        return f"{len(groups)} config groups (one is supported)"
    (group,) = groups.values()
    weights = _field(group, "weights") or {}
    scheme = (_field(weights, "type"), _field(weights, "num_bits"), _field(weights, "strategy"))
    if scheme[:2] != ("float", 8) or scheme[2] not in ("channel", "tensor", "block"):
        return f"weights (type, bits, strategy) = {scheme}"
    if not _field(weights, "symmetric", True) or _field(weights, "dynamic", False):
        return "asymmetric or dynamic weight scales"
    fmt = _field(qc, "format")
    if fmt not in ("float-quantized", "naive-quantized"):
        return f"format {fmt!r}"
    acts = _field(group, "input_activations")
    if acts is not None and (_field(acts, "type"), _field(acts, "num_bits")) != ("float", 8):
        return "input activations other than 8-bit float"
    return None


def prepare_fp8_params(model: nn.Module, unquantized=()) -> int:
    """Give every quantizable linear layer of ``model`` an empty e4m3fn ``weight`` and a
    float32 ``weight_scale`` [output rows] parameter, each with a ``weight_loader``, so that
    a pre-quantized checkpoint's tensors load into them (before ``load_weights``).

    A scale tensor may be [rows, 1], [rows] or one value ([] / [1]: per tensor, repeated
    over the rows of its shard); weights must be stored as float8_e4m3fn.

    Args:
        model: the model, before loading.
        unquantized: the config's modules kept unquantized (:func:`unquantized_modules`);
            a layer matching them, by its own name or by all of its checkpoint parts'
            (``q_proj``, ``k_proj``, ``v_proj`` of ``qkv_proj``), keeps its parameters.

    Returns:
        The number of layers prepared.

    Raises:
        ValueError: a fused layer with some of its parts unquantized, naming them.
    """
    parts = {}  # fused sub-name -> its checkpoint sub-names (q_proj, k_proj, v_proj)
    for sub, (fused, _) in getattr(model, "packed_modules_mapping", {}).items():
        parts.setdefault(fused, []).append(sub)
    count = 0
    for name, module in model.named_modules():
        if not getattr(module, "quantizable", False):
            continue
        stem, _, sub = name.rpartition(".")
        names = [f"{stem}.{p}" for p in parts.get(sub, ())]
        kept = [n for n in names if is_unquantized(n, unquantized)]
        if is_unquantized(name, unquantized) or (names and len(kept) == len(names)):
            continue
        if kept:
            raise ValueError(
                f"the checkpoint keeps {kept} unquantized but not the other parts of the fused "
                f"layer {name!r} ({names}); a fused layer loads all in fp8 or none"
            )
        old = module.weight
        weight = nn.Parameter(torch.empty_like(old, dtype=FP8_DTYPE), requires_grad=False)
        weight.weight_loader = _checked_fp8(module.weight_loader, name)
        module.weight = weight
        scale = nn.Parameter(
            torch.ones(old.shape[0], dtype=torch.float32, device=old.device), requires_grad=False
        )
        scale.weight_loader = _scale_loader(module)
        module.weight_scale = scale
        count += 1
    return count


def _checked_fp8(loader, name: str):
    """``loader`` for the fp8 weight of layer ``name``, refusing a tensor stored in another
    dtype (copying a 16-bit value into e4m3 without its scale would be silently wrong)."""

    def load(param: nn.Parameter, loaded, shard_id: object = None) -> None:
        stored = stored_dtype(loaded)
        if stored != "F8_E4M3":
            part = "" if shard_id is None else f" (part {shard_id!r})"
            hint = (
                "fp8 layers here read e4m3 weights only"
                if stored in ("F8_E5M2", str(torch.float8_e5m2))
                else "a layer kept unquantized must be listed in the quantization_config's "
                "'ignore' (compressed-tensors), 'modules_to_not_convert' (fbgemm_fp8) or "
                "'ignored_layers' (fp8)"
            )
            raise ValueError(
                f"the pre-quantized fp8 weight of {name!r}{part} is stored as {stored}, "
                f"expected float8_e4m3fn (F8_E4M3); {hint}"
            )
        if shard_id is None:
            loader(param, loaded)
        else:
            loader(param, loaded, shard_id)

    return load


def _scale_loader(module: nn.Module):
    """The loader of ``module.weight_scale``: per-row scales go through the layer's own
    row loader (this rank's rows of the shard); a per-tensor scale fills its shard's rows
    on this rank (``output_slices``), or every row for a matrix stored fused (Phi-3's
    ``qkv_proj``, shard None)."""

    def load(param: nn.Parameter, loaded, shard_id: object = None) -> None:
        scale = as_tensor(loaded).float().reshape(-1)  # [rows] or [1]
        if scale.numel() == 1 and shard_id is None:  # the whole (possibly fused) matrix's
            param.data.copy_(scale.expand(param.shape[0]))
        elif scale.numel() == 1:
            offset, size = module.output_slices()[shard_id]
            param.data[offset : offset + size] = scale
        elif shard_id is None:
            module.weight_loader(param, scale)
        else:
            module.weight_loader(param, scale, shard_id)

    return load
