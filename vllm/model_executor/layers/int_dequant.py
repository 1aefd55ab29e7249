"""GPTQ and AWQ weights dequantized to the model's dtype as they are read.

Which checkpoints load so: vllm/model_executor/layers/int_checkpoint.py. Each quantized
linear layer ``<x>`` of ``out_features`` rows and ``in_features`` columns is stored as:

- GPTQ: ``<x>.qweight`` int32 ``[in / (32 / bits), out]``: ``32 / bits`` consecutive input
  channels per word, channel ``j`` of a word in its bits ``j * bits ..``;
  ``<x>.qzeros`` int32 ``[groups, out / (32 / bits)]``: the zero points packed the same way
  along the output dimension (stored minus one in the classic "gptq" format);
  ``<x>.scales`` ``[groups, out]`` (float16); ``<x>.g_idx`` int32 ``[in]``: the group of each
  input channel (``i // group_size`` unless act-order reordered them).
- AWQ (GEMM): ``<x>.qweight`` int32 ``[in, out / 8]`` and ``<x>.qzeros`` int32
  ``[in / group_size, out / 8]``: 4-bit values packed along the output dimension, the 4 bits
  ``4 * i ..`` of a word holding output column :data:`AWQ_PACK_ORDER` ``[i]`` of its 8;
  ``<x>.scales`` ``[in / group_size, out]``; zero points stored as they are.

The weight is ``(q - zero) * scale`` with the zero point and scale of the input channel's
group, ``[out, in]`` as an unquantized checkpoint stores ``<x>.weight``: computed in float32
(the difference of integers is exact, so one rounding) and cast to the model's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from vllm.model_executor.layers.int_checkpoint import IntCheckpoint
from vllm.model_executor.weight_utils import as_tensor

# AutoAWQ's GEMM packing: value i of a word (bits 4 * i ..) is output column
# AWQ_PACK_ORDER[i] of the word's 8 columns
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# the checkpoint tensors of one quantized layer, by suffix
QUANT_PARTS = ("qweight", "qzeros", "scales", "g_idx")


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The unsigned ``bits``-bit values packed in the int32 words of ``packed`` [R, C]
    along ``dim``: value ``j`` of a word in its bits ``j * bits ..``.

    Returns:
        int32 [R * 32 / bits, C] for ``dim`` 0 (a word's values are consecutive rows),
        [R, C * 32 / bits] for ``dim`` 1 (consecutive columns).
    """
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)  # [per_word]
    words = packed.to(torch.int32)
    mask = (1 << bits) - 1  # an arithmetic shift's sign bits are masked off
    if dim == 0:
        values = (words[:, None, :] >> shifts[None, :, None]) & mask  # [R, per_word, C]
        return values.reshape(words.shape[0] * per_word, words.shape[1])
    values = (words[:, :, None] >> shifts[None, None, :]) & mask  # [R, C, per_word]
    return values.reshape(words.shape[0], words.shape[1] * per_word)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's 4-bit values of ``packed`` [R, C] in column order: [R, 8 * C] int32."""
    values = unpack_int32(packed, 4, dim=1)  # [R, 8C], in the words' order
    # column c of a word is its value AWQ_PACK_ORDER.index(c)
    where = torch.tensor([AWQ_PACK_ORDER.index(c) for c in range(8)], device=packed.device)
    cols = torch.arange(packed.shape[1], device=packed.device)[:, None] * 8 + where  # [C, 8]
    return values[:, cols.reshape(-1)]


def _shape_error(name: str, what: str, got, expected) -> ValueError:
    return ValueError(
        f"the {what} of quantized layer {name!r} has shape {tuple(got)}, expected {expected}"
    )


def dequantize_gptq(
    parts: dict[str, torch.Tensor], ckpt: IntCheckpoint, dtype: torch.dtype, name: str
) -> torch.Tensor:
    """A GPTQ layer's weight [out, in] in ``dtype`` from its ``qweight``, ``qzeros``,
    ``scales`` and (unless absent) ``g_idx`` tensors (module docstring).

    Raises:
        ValueError: shapes that do not fit together, or group indices out of range,
            naming the layer.
    """
    q = unpack_int32(parts["qweight"], ckpt.bits, dim=0)  # [in, out]
    zeros = unpack_int32(parts["qzeros"], ckpt.bits, dim=1) + ckpt.zero_offset  # [groups, out]
    scales = parts["scales"].float()  # [groups, out]
    n_in, n_out = q.shape
    groups = scales.shape[0]
    if scales.dim() != 2 or scales.shape[1] != n_out:
        raise _shape_error(name, "scales", scales.shape, f"(groups, {n_out})")
    if tuple(zeros.shape) != tuple(scales.shape):
        expected = (groups, n_out * ckpt.bits // 32)
        raise _shape_error(name, "qzeros", parts["qzeros"].shape, expected)
    g_idx = parts.get("g_idx")
    if g_idx is None:  # one group per group_size consecutive input channels
        size = n_in if ckpt.group_size == -1 else ckpt.group_size
        g_idx = torch.arange(n_in, device=q.device) // size
    g_idx = g_idx.long()
    if tuple(g_idx.shape) != (n_in,):
        raise _shape_error(name, "g_idx", g_idx.shape, (n_in,))
    if n_in and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
        raise ValueError(
            f"the g_idx of quantized layer {name!r} names groups {int(g_idx.min())}.."
            f"{int(g_idx.max())}, but its scales hold {groups}"
        )
    weight = (q - zeros[g_idx]).float() * scales[g_idx]  # [in, out]
    return weight.t().contiguous().to(dtype)


def dequantize_awq(
    parts: dict[str, torch.Tensor], ckpt: IntCheckpoint, dtype: torch.dtype, name: str
) -> torch.Tensor:
    """An AWQ (GEMM) layer's weight [out, in] in ``dtype`` from its ``qweight``,
    ``qzeros`` and ``scales`` tensors (module docstring).

    Raises:
        ValueError: shapes that do not fit together or ``group_size``, naming the layer.
    """
    q = unpack_awq(parts["qweight"])  # [in, out]
    zeros = unpack_awq(parts["qzeros"])  # [groups, out]
    scales = parts["scales"].float()  # [groups, out]
    n_in, n_out = q.shape
    size = n_in if ckpt.group_size == -1 else ckpt.group_size
    groups = -(-n_in // size)
    if tuple(scales.shape) != (groups, n_out):
        raise _shape_error(name, f"scales (group_size {ckpt.group_size})", scales.shape,
                           (groups, n_out))  # fmt: skip
    if tuple(zeros.shape) != (groups, n_out):
        raise _shape_error(name, "qzeros", parts["qzeros"].shape, (groups, n_out // 8))
    g_idx = torch.arange(n_in, device=q.device) // size  # [in]
    weight = (q - zeros[g_idx]).float() * scales[g_idx]  # [in, out]
    return weight.t().contiguous().to(dtype)


def int_dequantized_weights(
    weights: Iterable[tuple[str, object]], ckpt: IntCheckpoint, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's ``(name, tensor)`` items with each quantized layer's tensors
    (``<x>.qweight``, ``<x>.qzeros``, ``<x>.scales``, GPTQ's ``<x>.g_idx``) replaced by
    ``<x>.weight`` dequantized to ``dtype`` (:func:`dequantize_gptq` /
    :func:`dequantize_awq`), everything else (biases, unquantized layers, norms,
    embeddings) passed on as read.

    A layer's tensors may come in any order, from any file: each is read whole and waits
    for the others (a lazy safetensors slice is valid only until the next item). A GPTQ
    layer stored without ``g_idx`` is dequantized at the end with ``i // group_size``
    groups, unless ``desc_act`` says its channels were reordered.

    Raises:
        ValueError: at the end, layers missing some of their tensors (naming them and what
            is missing), or a layer's tensors that do not fit together.
    """
    gptq = ckpt.method == "gptq"
    needed = set(QUANT_PARTS) if gptq else set(QUANT_PARTS[:3])
    dequantize = dequantize_gptq if gptq else dequantize_awq
    waiting: dict[str, dict[str, torch.Tensor]] = {}  # layer -> its tensors read so far
    for name, loaded in weights:
        layer, _, part = name.rpartition(".")
        if part not in needed:
            yield name, loaded
            continue
        parts = waiting.setdefault(layer, {})
        parts[part] = as_tensor(loaded)
        if needed <= parts.keys():
            yield f"{layer}.weight", dequantize(waiting.pop(layer), ckpt, dtype, layer)
    # GPTQ layers saved without g_idx: their groups follow from group_size
    without_g_idx = needed - {"g_idx"}
    late = [
        k for k, v in waiting.items() if gptq and not ckpt.desc_act and v.keys() == without_g_idx
    ]
    missing = {k: sorted(needed - v.keys()) for k, v in waiting.items() if k not in late}
    if missing:
        shown = dict(list(sorted(missing.items()))[:5])
        act = " (desc_act: g_idx is needed)" if ckpt.desc_act else ""
        raise ValueError(
            f"{ckpt.method} checkpoint layers without all of their tensors{act}: {len(missing)} "
            f"layers, e.g. {shown} missing"
        )
    for layer in late:
        yield f"{layer}.weight", dequantize(waiting.pop(layer), ckpt, dtype, layer)
