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
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)  # [32]
    bits = (bitmask[:, :need, None] >> shifts) & 1  # [rows, need, 32]
    return bits.reshape(bitmask.shape[0], need * 32)[:, :vocab_size].bool()  # [rows, vocab]


def apply_token_bitmask(
    logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor
) -> torch.Tensor:
    """Set the disallowed tokens of the constrained ``rows`` to -inf, in place.

    Args:
        logits: [num_samples, vocab] float32, edited in place.
        rows: [k] int64 indices into ``logits``' rows (the constrained sample rows).
        bitmask: [k, words] int32, one packed row per entry of ``rows``, on ``logits``'
            device.
    Returns:
        ``logits``.
    """
    allowed = unpack_bitmask(bitmask, logits.shape[1])  # [k, vocab]
    sub = logits[rows]  # [k, vocab] (a copy)
    logits[rows] = sub.masked_fill_(~allowed, float("-inf"))
    return logits
