"""fp8 checkpoints whose weights load dequantized to the model's dtype.

Some pre-quantized fp8 checkpoints have no fp8 kernel here
(vllm/model_executor/layers/fp8_checkpoint.py decides which):

- block-wise scales: one scale per ``[bn, bk]`` tile of a weight (``quant_method: "fp8"``
  with ``weight_block_size``, as DeepSeek's and Qwen3's "-FP8" releases; compressed-tensors'
  ``strategy: "block"`` with ``block_structure``). The checkpoint stores the scales as
  ``weight_scale_inv`` (fp8) or ``weight_scale`` (compressed-tensors), shaped
  ``[ceil(N / bn), ceil(K / bk)]`` for an ``[N, K]`` weight; despite its name
  ``weight_scale_inv`` multiplies too (the value a tile was divided by when quantized);
- mixture-of-experts models with per-row or per-tensor scales: the experts run in the
  model's dtype here, so the whole checkpoint does.

Their weights are dequantized as they are read, ``weight.float() * scale`` with the scale
expanded over its rows (per row), its tile (per block) or the matrix (per tensor), then
cast to the model's dtype, so the model is an ordinary unquantized one: every kernel,
parallelism and feature of the engine applies, and it computes what the checkpoint's
values mean exactly (in float32; rounded once to a 16-bit dtype otherwise). It holds the
weights in that dtype: twice an fp8 model's memory for bf16, none of fp8's speed.
``--quantization fp8`` then quantizes the dequantized projections again, per row
(vllm/model_executor/layers/fp8.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from vllm.model_executor.weight_utils import as_tensor

# checkpoint tensors that hold a weight's scales, by suffix
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
# fp8 dtypes as torch and safetensors name them
_FP8_TORCH = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP8_SAFETENSORS = ("F8_E4M3", "F8_E5M2")


def stored_dtype(loaded) -> str:
    """A checkpoint tensor's dtype for checks and messages: a lazy safetensors slice's as
    safetensors names it ("F8_E4M3", "BF16", ...), a tensor's as torch does, but
    float8_e4m3fn as "F8_E4M3" too."""
    if isinstance(loaded, torch.Tensor):
        return "F8_E4M3" if loaded.dtype == torch.float8_e4m3fn else str(loaded.dtype)
    return loaded.get_dtype()


def is_fp8(loaded) -> bool:
    """Whether a checkpoint tensor (or lazy safetensors slice) is stored in an fp8 dtype."""
    if isinstance(loaded, torch.Tensor):
        return loaded.dtype in _FP8_TORCH
    return loaded.get_dtype() in _FP8_SAFETENSORS


def dequantize_fp8(
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] | None,
    dtype: torch.dtype,
    name: str = "weight",
) -> torch.Tensor:
    """``weight.float() * scale`` in ``dtype``.

    Args:
        weight: [N, K] (or [..., N, K], experts stacked) float8_e4m3fn or float8_e5m2.
        scale: float32 or 16-bit; one value ([] or [1]: per tensor; with ``block`` a 2-D
            [1, 1] only for a weight of one tile), N values ([N] or [N, 1]: per row), or
            ``[ceil(N / bn), ceil(K / bk)]`` (per block; a last tile may be partial) with
            the same leading dimensions as ``weight``.
        block: (bn, bk), the tile of a block-wise checkpoint, else None.
        dtype: the result's dtype.
        name: the tensor's name, for messages.

    Returns:
        [N, K] (leading dimensions kept) in ``dtype``.

    Raises:
        ValueError: a scale shape that fits none of the three layouts, naming the
            tensor, both shapes and the shapes expected.
    """
    w = weight.float()  # [..., N, K]
    s = scale.float()
    n, k = w.shape[-2:]
    lead = tuple(w.shape[:-2])
    if block is not None:
        bn, bk = block
        tiles = (-(-n // bn), -(-k // bk))
        if tuple(s.shape) == lead + tiles:
            s = s.repeat_interleave(bn, dim=-2)[..., :n, :]  # [..., N, tiles_k]
            s = s.repeat_interleave(bk, dim=-1)[..., :k]  # [..., N, K]
            return (w * s).to(dtype)
    # one value; but a 2-D scale of a block-wise checkpoint is a grid of tiles: [1, 1] for
    # a weight of several tiles is a grid of the wrong size, not a scale per tensor
    if s.numel() == 1 and (block is None or s.dim() < 2):
        return (w * s.reshape(())).to(dtype)
    if tuple(s.shape) in (lead + (n,), lead + (n, 1)):
        return (w * s.reshape(lead + (n, 1))).to(dtype)  # [..., N, 1] over the rows
    tiled = "" if block is None else f" or one per {block[0]}x{block[1]} tile {lead + tiles}"
    raise ValueError(
        f"the scale of fp8 tensor {name!r} {tuple(w.shape)} has shape {tuple(s.shape)}: "
        f"expected one value (() or (1,)), one per row {lead + (n,)} or {lead + (n, 1)}{tiled}"
    )


def dequantized_weights(
    weights: Iterable[tuple[str, object]],
    block: tuple[int, int] | None,
    dtype: torch.dtype,
    unused: tuple[str, ...] = (),
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's ``(name, tensor)`` items with every fp8 ``<x>.weight`` replaced by
    its dequantized value (:func:`dequantize_fp8` with ``<x>.weight_scale_inv`` or
    ``<x>.weight_scale``), the scale tensors and names ending in ``unused`` (activation,
    KV-cache scales, zero points) dropped, everything else passed on as read.

    A weight and its scale may come in either order, from any file: each waits for the
    other (read whole: a lazy safetensors slice is valid only until the next item).

    Raises:
        ValueError: at the end, fp8 weights without a scale or scales without their
            weight, naming them (and the dtype of such a weight stored unquantized).
    """
    waiting_weights: dict[str, torch.Tensor] = {}
    waiting_scales: dict[str, torch.Tensor] = {}
    unquantized: dict[str, str] = {}  # weights passed on as stored -> their dtype
    for name, loaded in weights:
        suffix = next((s for s in SCALE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            key = name[: -len(suffix)] + ".weight"
            if key in waiting_weights:
                w = waiting_weights.pop(key)
                yield key, dequantize_fp8(w, as_tensor(loaded), block, dtype, key)
            else:
                waiting_scales[key] = as_tensor(loaded)
        elif unused and name.endswith(unused):
            continue
        elif is_fp8(loaded):
            if name in waiting_scales:
                s = waiting_scales.pop(name)
                yield name, dequantize_fp8(as_tensor(loaded), s, block, dtype, name)
            else:
                waiting_weights[name] = as_tensor(loaded)
        else:
            if name.endswith(".weight"):
                unquantized[name] = stored_dtype(loaded)
            yield name, loaded
    if waiting_weights or waiting_scales:
        stored = {n: unquantized[n] for n in sorted(waiting_scales) if n in unquantized}
        also = f" (stored unquantized, not fp8: {dict(list(stored.items())[:5])})" if stored else ""
        raise ValueError(
            f"fp8 checkpoint tensors without their pair: weights without a weight_scale / "
            f"weight_scale_inv {sorted(waiting_weights)[:5]}, scales without their weight "
            f"{sorted(waiting_scales)[:5]}{also}"
        )
