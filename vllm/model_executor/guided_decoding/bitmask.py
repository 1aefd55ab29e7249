"""Applying packed token bitmasks to logits on the device (worker side, torch only).

A bitmask row has ``ceil(vocab / 32)`` int32 words; bit ``j`` of word ``w`` (least
significant first) allows token ``32 * w + j``. This is xgrammar's layout.
"""

from __future__ import annotations

import torch


def words_per_row(vocab_size: int) -> int:
    """int32 words of one bitmask row for a vocabulary of ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Allowed-token booleans from packed rows.

    Args:
        bitmask: [rows, words] int32, ``words >= ceil(vocab_size / 32)``.
        vocab_size: tokens to unpack per row.
    Returns:
        [rows, vocab_size] bool, True where the token is allowed.
    Raises:
        ValueError: a bitmask too narrow for ``vocab_size``.
    """
    need = words_per_row(vocab_size)
    if bitmask.dim() != 2 or bitmask.shape[1] < need:
        raise ValueError(
            f"token bitmask of shape {tuple(bitmask.shape)} is too narrow for a vocabulary "
            f"of {vocab_size} tokens (needs [rows, >= {need}])."
        )
    # Little-endian words: byte k of word w holds tokens 32w + 8k .. 32w + 8k + 7, so the
    # flat byte view's byte i holds tokens 8i .. 8i + 7 (bit b -> token 8i + b). One
    # table lookup per byte is several times faster than shifting every word 32 times.
    data = bitmask[:, :need].contiguous().view(torch.uint8)  # [rows, 4 * need]
    bits = _byte_bits(bitmask.device)[data.long()]  # [rows, 4 * need, 8]
    return bits.reshape(bitmask.shape[0], need * 32)[:, :vocab_size]  # [rows, vocab]


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: row v holds the bits of byte value v, least significant first."""
    table = _BYTE_BITS.get(device)
    if table is None:
        values = torch.arange(256, dtype=torch.int32)[:, None]  # [256, 1]
        table = ((values >> torch.arange(8, dtype=torch.int32)) & 1).bool().to(device)
        _BYTE_BITS[device] = table
    return table


def apply_token_bitmask(
    logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor
) -> torch.Tensor:
    """Set the disallowed tokens of the constrained ``rows`` to -inf, in place.

    Args:
        logits: [num_samples, vocab] float32, edited in place.
        rows: [k] int64 indices into ``logits``' rows (the constrained sample rows),
            sorted and unique.
        bitmask: [k, words] int32, one packed row per entry of ``rows``, on ``logits``'
            device.
    Returns:
        ``logits``.

    On CPU this is xgrammar's own kernel; elsewhere (CUDA) a table lookup per byte and a
    masked fill in torch (:func:`unpack_bitmask`), a handful of small kernels and no
    host sync.
    """
    every = rows.shape[0] == logits.shape[0]  # sorted unique rows: all of them, in order
    if _on_cpu(logits):  # xgrammar's C++ kernel: a few times faster on CPU
        import xgrammar as xgr

        if every:
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            return logits
        # xgrammar reads bitmask row i for logits row i: place the rows at their indices
        full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)
        full[rows] = bitmask  # [num_samples, words], -1 = all allowed
        xgr.apply_token_bitmask_inplace(logits, full, indices=rows.tolist())
        return logits
    allowed = unpack_bitmask(bitmask, logits.shape[1])  # [k, vocab]
    if every:  # every row constrained, in order (decode)
        return logits.masked_fill_(~allowed, float("-inf"))
    sub = logits[rows]  # [k, vocab] (a copy)
    logits[rows] = sub.masked_fill_(~allowed, float("-inf"))
    return logits


def _on_cpu(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"
