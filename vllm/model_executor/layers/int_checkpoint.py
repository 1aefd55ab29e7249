"""GPTQ and AWQ checkpoints: which load, dequantized to the model's dtype.

A checkpoint whose ``quantization_config`` (read as ``fp8_checkpoint.stored_quantization``
reads it) says ``quant_method: "gptq"`` or ``"awq"`` stores each quantized linear layer as
integers packed into int32 words, with a scale and a zero point per group of input
channels (vllm/model_executor/layers/int_dequant.py reads them). There are no integer
kernels here: the weights are dequantized as they are read, ``(q - zero) * scale`` in
float32 cast once to the model's dtype, so the model is an ordinary unquantized one (every
kernel, parallelism and feature of the engine applies) and holds the unquantized model's
memory. ``--quantization fp8`` then quantizes the dequantized projections per row
(vllm/model_executor/layers/fp8.py).

Loaded:

- GPTQ (AutoGPTQ, GPTQModel, optimum's "-GPTQ-Int4" / "-Int8" releases): ``bits`` 4 or 8,
  any ``group_size`` (-1: one group for all input channels), with ``desc_act`` (act-order:
  the ``g_idx`` tensor gives each input channel's group, in no particular order) or without,
  symmetric or not. ``checkpoint_format`` (GPTQModel's newer key is ``format``) "gptq", the
  classic format and the default when neither key is there, stores each zero point minus
  one; "gptq_v2" stores it as it is.
- AWQ (AutoAWQ's GEMM packing, ``version: "gemm"``, also the default when absent): 4 bits,
  with zero points.

The config is config.json's ``quantization_config``, else the file the tools wrote beside
the weights before transformers read that key (AutoGPTQ's and GPTQModel's
``quantize_config.json``, AutoAWQ's ``quant_config.json``).

Which layers are quantized is read from the tensors, not the config: a layer stored as
``qweight`` / ``qzeros`` / ``scales`` (and GPTQ's ``g_idx``) is dequantized to ``weight``,
one stored as ``weight`` loads as stored. So ``modules_to_not_convert``, optimum's
``modules_in_block_to_quantize`` and GPTQ's ``lm_head`` flag need no reading, and fused
layers (qkv, gate_up) may mix quantized and unquantized parts. Mixture-of-experts
checkpoints store each expert's projections as their own quantized layers: dequantized,
they carry an unquantized checkpoint's names and load through the experts' usual path (the
router, which both tools leave unquantized, loads as stored).

Refused, naming the value: GPTQ ``bits`` other than 4 and 8 (2, 3), GPTQ formats other
than "gptq" / "gptq_v2" ("marlin", "bitblas", ``is_marlin_format``), a ``pack_dtype`` other
than int32, GPTQModel's ``dynamic`` per-module overrides (bits or group sizes that differ
by module, which are not guessed here), AWQ ``bits`` other than 4, AWQ versions other than
"gemm" (gemv, gemv_fast, marlin, exllama, ipex: other packings) and AWQ without zero points
(``zero_point: false``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

# quantization_config.quant_method values of the checkpoints loaded here (--quantization
# may name them too)
INT_METHODS = ("gptq", "awq")
GPTQ_BITS = (4, 8)
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_VERSIONS = ("gemm",)


@dataclass(frozen=True)
class IntCheckpoint:
    """How a GPTQ or AWQ checkpoint loads (dequantized to the model's dtype).

    Attributes:
        method: its ``quant_method``, "gptq" or "awq".
        bits: bits per weight (4 or 8; AWQ 4).
        group_size: input channels per scale and zero point; -1 for one group per matrix.
        fmt: GPTQ's ``checkpoint_format`` ("gptq" or "gptq_v2") or AWQ's ``version``
            ("gemm").
        zero_offset: what a stored zero point is short of the zero point: 1 for GPTQ's
            "gptq" format (stored = zero - 1), else 0.
        desc_act: GPTQ's act-order: the checkpoint's ``g_idx`` is needed (without it each
            input channel ``i`` is in group ``i // group_size``).
    """

    method: str
    bits: int
    group_size: int
    fmt: str
    zero_offset: int = 0
    desc_act: bool = False

    def describe(self) -> str:
        """e.g. "4-bit, groups of 128, desc_act, format gptq" (for logs and the summary)."""
        groups = "one group per row" if self.group_size == -1 else f"groups of {self.group_size}"
        act = ", desc_act" if self.desc_act else ""
        return f"{self.bits}-bit, {groups}{act}, format {self.fmt}"


def _field(cfg, name: str, default=None):
    """``cfg[name]`` of a dict or ``cfg.name`` of a transformers config object."""
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def _refuse(model: str, method: str, why: str, where: str) -> ValueError:
    return ValueError(
        f"{model!r} holds pre-quantized weights (quant_method={method!r} in {where}): {why}. "
        "GPTQ checkpoints load with bits 4 or 8 in the 'gptq' or 'gptq_v2' format and AWQ "
        "ones with 4 bits in the 'gemm' version, dequantized to the model's dtype on load "
        "(no integer kernels here); otherwise use the unquantized checkpoint."
    )


def checkpoint_int_method(model: str, hf_config) -> IntCheckpoint | None:
    """How a GPTQ or AWQ checkpoint loads, or None when its config says neither (an
    unquantized checkpoint, or another method: see ``fp8_checkpoint.checkpoint_fp8_method``).

    Args:
        model: the checkpoint's path (for messages).
        hf_config: its transformers config.

    Raises:
        ValueError: a GPTQ or AWQ variant not loaded here (module docstring), naming the
            method, the field and its value.
    """
    stored = _stored_config(hf_config, model)
    if stored is None:
        return None
    where, qc = stored
    method = _field(qc, "quant_method")
    if not isinstance(method, str) or method.lower() not in INT_METHODS:
        return None
    method = method.lower()
    why = _packing_problem(qc)
    if why is None:
        why = _gptq_problem(qc) if method == "gptq" else _awq_problem(qc)
    if why is not None:
        raise _refuse(model, method, why, where)
    bits = _bits(qc)
    group_size = _field(qc, "group_size", _field(qc, "q_group_size", -1))
    if group_size is None:
        group_size = -1
    if not isinstance(group_size, int) or not (group_size == -1 or group_size > 0):
        raise _refuse(model, method, f"group_size={group_size!r} (-1 or a positive int)", where)
    if method == "awq":
        return IntCheckpoint(method, bits, group_size, "gemm")
    fmt = _gptq_format(qc)
    return IntCheckpoint(
        method,
        bits,
        group_size,
        fmt,
        zero_offset=1 if fmt == "gptq" else 0,
        desc_act=bool(_field(qc, "desc_act", False)),
    )


def _stored_config(hf_config, model: str) -> tuple[str, object] | None:
    """(where, config) of the checkpoint's quantization: ``fp8_checkpoint.
    stored_quantization``'s (config.json's ``quantization_config``), else the file the
    tools wrote beside the weights before transformers read one: AutoGPTQ's and
    GPTQModel's ``quantize_config.json`` (``quant_method`` "gptq" when it has none), or
    AutoAWQ's ``quant_config.json`` (``w_bit``, ``q_group_size``: "awq")."""
    from vllm.model_executor.layers.fp8_checkpoint import stored_quantization

    stored = stored_quantization(hf_config, model)
    if stored is not None:
        return stored
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        path = os.path.join(model, name)
        if os.path.isfile(path):
            with open(path) as f:
                qc = json.load(f)
            if isinstance(qc, dict) and ("bits" in qc or "w_bit" in qc):  # a tool's file
                return f"its {name}", {"quant_method": method, **qc}
    return None


def _bits(qc):
    """``bits``, or AutoAWQ's older ``w_bit``."""
    return _field(qc, "bits", _field(qc, "w_bit"))


def _gptq_format(qc) -> str:
    """GPTQ's checkpoint format, lower case: ``checkpoint_format``, else GPTQModel's
    ``format``, else "gptq" (AutoGPTQ's older releases write neither)."""
    fmt = _field(qc, "checkpoint_format") or _field(qc, "format") or "gptq"
    return fmt.lower() if isinstance(fmt, str) else fmt


def _packing_problem(qc) -> str | None:
    """Why the packing of a GPTQ or AWQ config is not the int32 one read here, or None."""
    pack = _field(qc, "pack_dtype")
    if pack not in (None, "int32"):
        return f"pack_dtype={pack!r} (int32 is read)"
    dynamic = _field(qc, "dynamic")
    if dynamic:
        shown = list(dynamic)[:5] if isinstance(dynamic, dict) else dynamic
        return (
            f"'dynamic' per-module overrides {shown} (a bits or group size that differs by "
            "module is not guessed)"
        )
    return None


def _gptq_problem(qc) -> str | None:
    """Why a GPTQ config is not one loaded here, or None."""
    bits = _bits(qc)
    if bits not in GPTQ_BITS:
        return f"bits={bits!r} (GPTQ loads with {' or '.join(map(str, GPTQ_BITS))})"
    if _field(qc, "is_marlin_format", False):
        return "is_marlin_format=True (Marlin's repacked weights)"
    fmt = _gptq_format(qc)
    if fmt not in GPTQ_FORMATS:
        return f"checkpoint_format={fmt!r} (GPTQ loads in {list(GPTQ_FORMATS)})"
    return None


def _awq_problem(qc) -> str | None:
    """Why an AWQ config is not one loaded here, or None."""
    bits = _bits(qc)
    if bits != 4:
        return f"bits={bits!r} (AWQ loads with 4)"
    version = _field(qc, "version") or _field(qc, "checkpoint_format") or "gemm"
    if not isinstance(version, str) or version.lower() not in AWQ_VERSIONS:
        return f"version={version!r} (AWQ loads in the 'gemm' version, AutoAWQ's GEMM packing)"
    if _field(qc, "zero_point", True) is False:
        return "zero_point=False (AWQ loads with zero points)"
    return None
