"""The attention arithmetic TORCH_SDPA (and FLASHINFER's graph prefill) share: masks for
causal and sliding-window attention, and one attend call that also soft-caps scores.

Sliding window, as transformers' ``sliding_window_overlay``: a query at position ``i``
attends to key positions ``j`` with ``i - window < j <= i`` (the ``window`` most recent
positions, itself included). Soft-capping (Gemma): scores become ``cap * tanh(s / cap)``
before the mask and softmax, as transformers' eager attention does; without a cap the call is
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_window(layer) -> tuple[int | None, float | None]:
    """(sliding window, logits soft cap) of an attention layer; (None, None) for a layer
    object without them (tests pass plain namespaces)."""
    return getattr(layer, "sliding_window", None), getattr(layer, "logits_soft_cap", None)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean mask [..., len(q_pos), len(k_pos)]: True where the query may see the key.

    q_pos: [..., Lq] int64 positions of the queries; k_pos: [..., Lk] int64 positions of the
    keys (broadcast against each other). Causal (``k <= q``) and, with ``window``, within the
    window (``k > q - window``).
    """
    q = q_pos[..., :, None]  # [..., Lq, 1]
    k = k_pos[..., None, :]  # [..., 1, Lk]
    mask = k <= q
    if window is not None:
        mask = mask & (k > q - window)
    return mask  # [..., Lq, Lk]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Grouped-query attention.

    q: [B, num_heads, Lq, D]; k, v: [B, num_kv_heads, Lk, D]; ``mask``: bool, broadcastable
    to [B, num_heads, Lq, Lk] (True = attend), or ``is_causal`` (Lq == Lk). Returns
    [B, num_heads, Lq, D].
    """
    if soft_cap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [B, num_heads, Lk, D]
    v = v.repeat_interleave(group, dim=1)  # [B, num_heads, Lk, D]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, num_heads, Lq, Lk]
    scores = torch.tanh(scores / soft_cap) * soft_cap
    if is_causal:
        n = scores.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()  # [Lq, Lk]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # [B, num_heads, Lq, D]


def causal_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Causal attention of one sequence over its own tokens (positions 0 .. L-1).

    q: [L, num_heads, D]; k, v: [L, num_kv_heads, D]; returns [L, num_heads, D]. Without a
    window that cuts anything (``window`` None or >= L) it is SDPA's ``is_causal`` (static
    shapes: CUDA-graph capturable); otherwise an explicit mask of :func:`window_mask`.
    """
    qi = q.transpose(0, 1).unsqueeze(0)  # [1, num_heads, L, D]
    ki = k.transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, L, D]
    vi = v.transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, L, D]
    n = q.shape[0]
    if window is None or window >= n:
        out = attend(qi, ki, vi, scale, is_causal=True, soft_cap=soft_cap)
    else:
        pos = torch.arange(n, device=q.device)  # [L]
        out = attend(qi, ki, vi, scale, mask=window_mask(pos, pos, window), soft_cap=soft_cap)
    return out[0].transpose(0, 1)  # [L, num_heads, D]
