"""Online FP8 weight quantization (``--quantization fp8``) of the decoder's dense projections.

Scheme: after loading, every linear layer that allows it (``LinearBase.quantizable``:
qkv, o, gate_up, down; not a mixture-of-experts router, not the embedding or lm_head)
keeps its weight [N, K] as ``float8_e4m3fn`` with one float32 scale per output row:

    scale[n] = max_k |W[n, k]| / 448,    Wq[n, k] = round_e4m3(W[n, k] / scale[n])

(448 is the largest finite e4m3fn value; a row of zeros gets scale 1). Upstream vLLM's
online fp8 keeps one scale per tensor; a scale per row loses less on rows of small weights
and costs N floats. Under tensor parallelism a row-parallel layer (``input_is_parallel``)
holds a slice of each row, so its row maxima are reduced over the TP group (MAX) first:
every rank then holds exactly its slice of the TP = 1 quantized weight. Mixture-of-experts
expert weights keep the model's dtype.

A quantized layer computes ``y = x @ (Wq * scale[:, None]).T + bias`` by
:func:`fp8_linear`, on the first of these paths that applies:

1. CUDA, few rows, triton (``dispatch.get_triton_gemv``: one row through small or large
   weights): the GEMV kernels read the fp8 weights (half the bytes of bf16) and apply the
   row scales after the float32 sums; activations are not quantized (weight-only).
2. CUDA, bfloat16 activations, compute capability >= 8.9 (fp8 tensor cores), K and N
   multiples of 16: W8A8. Each activation row is quantized dynamically
   (``scale_x[t] = max_k |x[t, k]| / 448``, :func:`quantize_rows`) and
   ``torch._scaled_mm`` multiplies with both row-wise scales into bfloat16.
3. Otherwise (CPU, float16 / float32 models, older GPUs): the weight is dequantized to the
   activation dtype (``Wq.float() * scale``) and ``F.linear`` runs (weight-only). On CPU in
   float32 this equals Hugging Face transformers on the dequantized weights exactly.

The decoder's fused small-batch path (vllm/model_executor/models/llama.py) passes the same
scales to the fused norm + GEMV kernels.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed.tp_ops import tensor_model_parallel_all_reduce
from vllm.kernels.dispatch import get_triton_fp8_quant, get_triton_gemv

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
# scales are amax * (1 / 448), a multiplication: the same float32 result on every device
# (CUDA torch turns a division by a scalar into this product; vllm/kernels/fp8_quant.py too)
INV_FP8_MAX = 1.0 / FP8_MAX


def row_scales(amax: torch.Tensor) -> torch.Tensor:
    """Scales [N] float32 from row maxima ``amax`` [N] (any float dtype): ``amax / 448``
    computed as ``amax * INV_FP8_MAX`` (float32), 1 where a row is all zeros."""
    amax = amax.float()
    return torch.where(amax > 0, amax * INV_FP8_MAX, torch.ones_like(amax))


def quantize_weight(
    weight: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight`` [N, K] to e4m3fn with one scale per row (weights, and
    activation rows in :func:`quantize_rows_torch`).

    Args:
        weight: [N, K], any float dtype.
        amax: [N] row maxima to use instead of this tensor's own (a row-parallel layer's,
            reduced over the TP group); None: ``weight.abs().amax(dim=1)``.

    Returns:
        (wq [N, K] float8_e4m3fn, scale [N] float32) with ``wq.float() * scale[:, None]``
        the weight to within e4m3's rounding (3 mantissa bits: relative error <= 1/16 for
        values above the smallest normal, 2**-6 * scale).
    """
    if amax is None:
        amax = weight.abs().amax(dim=1)  # [N]
    scale = row_scales(amax)  # [N] float32
    wq = (weight.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [N, K]
    return wq, scale


def dequantize(wq: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``wq`` [N, K] e4m3fn, ``scale`` [N] float32 -> [N, K] in ``dtype``
    (``wq.float() * scale[:, None]``, rounded once)."""
    return (wq.float() * scale[:, None]).to(dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row quantization of activations ``x`` [T, K]: (xq [T, K] e4m3fn,
    scale [T, 1] float32), ``scale[t] = max_k |x[t, k]| / 448`` (1 for a zero row).
    On CUDA one Triton launch (vllm/kernels/fp8_quant.py, the same values)."""
    kernel = get_triton_fp8_quant(x)
    if kernel is not None:
        return kernel.quantize_rows(x, FP8_DTYPE, FP8_MAX, INV_FP8_MAX)
    return quantize_rows_torch(x)


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` in torch ops (CPU, and the kernel's reference): each row
    quantized as a weight row is (:func:`quantize_weight`)."""
    xq, scale = quantize_weight(x)  # [T, K] e4m3fn, [T]
    return xq, scale[:, None]  # [T, 1]


def scaled_mm_fits(x: torch.Tensor, wq: torch.Tensor) -> bool:
    """Whether ``x`` [T, K] @ ``wq`` [N, K].T takes the W8A8 path (module docstring, 2)."""
    if not x.is_cuda or x.dtype != torch.bfloat16:
        return False
    n, k = wq.shape
    return n % 16 == 0 and k % 16 == 0 and torch.cuda.get_device_capability(x.device) >= (8, 9)


def fp8_linear(
    x: torch.Tensor, wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ dequantize(wq, scale).T + bias`` by the paths of the module docstring.

    Args:
        x: [T, K] activations (float32, float16 or bfloat16).
        wq: [N, K] float8_e4m3fn; scale: [N] float32; bias: [N] in x's dtype, or None.

    Returns:
        [T, N] in x's dtype.
    """
    gemv = get_triton_gemv(x, wq)
    if gemv is not None:
        return gemv.linear(x, wq, bias, weight_scale=scale)
    if scaled_mm_fits(x, wq):
        xq, x_scale = quantize_rows(x)  # [T, K] e4m3fn, [T, 1]
        y = torch._scaled_mm(
            xq, wq.t(), scale_a=x_scale, scale_b=scale[None, :], out_dtype=x.dtype
        )  # [T, N]
        return y if bias is None else y + bias
    return F.linear(x, dequantize(wq, scale, x.dtype), bias)  # [T, N]


def _row_amax(layer: nn.Module) -> torch.Tensor:
    """Row maxima [N] of ``layer.weight``; for a row-parallel layer under TP the max over
    the ranks' slices of each row (the unsplit row's)."""
    amax = layer.weight.abs().amax(dim=1).float()  # [N]
    if getattr(layer, "input_is_parallel", False) and layer.tp_size > 1:
        amax = tensor_model_parallel_all_reduce(amax, op="max")
    return amax


def _refuse_load(name: str, param: nn.Parameter, loaded_weight, shard_id=None) -> None:
    """The ``weight_loader`` of a quantized weight (:func:`quantize_model`): refuses."""
    raise ValueError(
        f"{name} is quantized to float8_e4m3fn (quantization='fp8'), so weights cannot be "
        "loaded into it; load them into an engine started without quantization."
    )


@torch.no_grad()
def quantize_model(model: nn.Module) -> tuple[int, int, int]:
    """Quantize every quantizable linear layer of ``model`` in place (module docstring).

    A layer is quantizable when it has ``quantizable = True`` and a ``weight_scale``
    buffer (vllm/model_executor/layers/linear.py ``LinearBase``). Its ``weight`` becomes
    an e4m3fn parameter and ``weight_scale`` the [N] float32 scales. Weights cannot be
    reloaded into a quantized model: the parameter's ``weight_loader`` raises a ValueError
    naming it (a plain copy would cast the new values to e4m3 under the old scales).

    Returns:
        (layers quantized, their weight bytes before, after, scales included).
    """
    count = before = after = 0
    for name, module in model.named_modules():
        if not getattr(module, "quantizable", False) or module.weight.dtype == FP8_DTYPE:
            continue
        weight = module.weight
        wq, scale = quantize_weight(weight, _row_amax(module))
        before += weight.numel() * weight.element_size()
        after += wq.numel() + scale.numel() * scale.element_size()
        module.weight = nn.Parameter(wq, requires_grad=False)
        module.weight.weight_loader = functools.partial(_refuse_load, f"{name}.weight")
        module.weight_scale = scale
        count += 1
    return count, before, after
