"""TORCH_SDPA's prefill over a cached context (automatic prefix caching).

A prefill row whose first ``c`` tokens are already in the paged cache feeds only the rest;
its keys and values were written into the cache just before (every layer writes before it
attends), so the row's whole context is gathered through its block table and each new token
attends to every cached token and causally among the new ones.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.attention.backends.sdpa_ops import attend, causal_attend, window_mask
from vllm.attention.kv_cache_dtype import from_cache


def context_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    md: Any,
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """Prefill where some rows start after ``md.context_lens[i]`` cached tokens.

    A row without context attends causally among its new keys, as
    ``torch_sdpa.causal_prefill`` does. A row with context
    ``c`` and ``m`` new tokens reads keys/values of positions ``0 .. c + m - 1`` from the
    cache (the step's keys were written there just before) and new token ``j`` attends to
    positions ``0 .. c + j`` (with ``window``, only the last ``window`` of them; scores
    capped by ``soft_cap``: see ``sdpa_ops``). Cached keys and values are read in q's
    dtype times ``kv_scales`` (k_scale, v_scale; ``kv_cache_dtype.from_cache``), so they
    equal the ``k`` / ``v`` the caller read back from the same rounding.

    q: [num_tokens, num_heads, head_size]; k, v: [num_tokens, num_kv_heads, head_size];
    kv_cache: [2, num_blocks + 1, block_size, num_kv_heads, head_size]; ``md``: the
    step's ``TorchSDPAMetadata`` (``query_start_loc``, ``context_lens``, ``block_tables``).
    Returns [num_tokens, num_heads, head_size].
    """
    out = torch.empty_like(q)
    starts = md.query_start_loc
    block_size, n_kv, d = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    for i, c in enumerate(md.context_lens):
        s, e = starts[i], starts[i + 1]
        if c == 0:  # as causal_prefill does for one sequence
            out[s:e] = causal_attend(q[s:e], k[s:e], v[s:e], scale, window, soft_cap)
            continue
        n = c + e - s
        blocks = md.block_tables[i, : -(-n // block_size)]  # [row blocks]
        kc = kv_cache[0][blocks].reshape(-1, n_kv, d)[:n]  # [n, num_kv_heads, head_size]
        vc = kv_cache[1][blocks].reshape(-1, n_kv, d)[:n]  # [n, num_kv_heads, head_size]
        kc = from_cache(kc, q.dtype, kv_scales[0])  # an 8-bit cache's values, model dtype
        vc = from_cache(vc, q.dtype, kv_scales[1])
        qpos = torch.arange(c, n, device=q.device)  # [m]
        kpos = torch.arange(n, device=q.device)  # [n]
        mask = window_mask(qpos, kpos, window)  # [m, n]
        qi = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, num_heads, m, head_size]
        ki = kc.transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, n, head_size]
        vi = vc.transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, n, head_size]
        oi = attend(qi, ki, vi, scale, mask=mask, soft_cap=soft_cap)  # [1, num_heads, m, D]
        out[s:e] = oi[0].transpose(0, 1)
    return out
