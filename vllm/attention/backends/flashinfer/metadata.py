"""FLASHINFER's wrapper path: the metadata of a step planned on FlashInfer's prefill or
decode wrapper (eager, or a captured decode size) and the attention that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm.attention.backends.abstract import AttentionImpl, AttentionMetadata
from vllm.attention.backends.flashinfer.paged_cache import rotate_and_write
from vllm.attention.kv_cache_dtype import layer_kv_scales


@dataclass
class FlashInferMetadata(AttentionMetadata):
    """Metadata of FLASHINFER: the planned wrapper of this pass (prefill or decode) and
    ``kv_rows`` [2, num_tokens] int64, the rows of each new token's key (row 0) and value
    (row 1) in the cache viewed as [(num_blocks + 1) * 2 * block_size, kv_heads, head_size]
    (see :func:`.paged_cache.slot_rows_host`), so a layer writes its cache with two index copies.
    ``window_wrappers``: sliding window -> the wrapper planned with that window (same pass,
    same page tables), run by layers whose ``sliding_window`` it is."""

    wrapper: Any = None
    kv_rows: torch.Tensor | None = None
    window_wrappers: dict[int, Any] | None = None


class FlashInferImpl(AttentionImpl):
    """Runs the planned wrapper of the pass (of the layer's sliding window, if any).

    With an 8-bit cache the layer's k_scale / v_scale go to ``run`` as Python floats
    (FlashInfer multiplies the softmax scale by k_scale and the output by v_scale), the
    same in eager steps and in captured graphs; scales of 1.0 are passed as None (no extra
    multiply)."""

    @staticmethod
    def forward(
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        positions: torch.Tensor | None = None,
        rotary_emb: Any = None,
    ) -> torch.Tensor:
        md: FlashInferMetadata = attn_metadata  # type: ignore[assignment]
        h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        if kv_cache.numel() == 0:  # memory profiling: no cache, attend within the batch
            if rotary_emb is not None:
                query, key = rotary_emb(positions, query, key)
            return _profile_attention(
                query.view(-1, h, d), key.view(-1, h_kv, d), value.view(-1, h_kv, d), layer.scale
            )
        query, key = rotate_and_write(layer, query, key, value, kv_cache, md.kv_rows, positions,
                                      rotary_emb)  # fmt: skip
        q = query.view(-1, h, d)  # [num_tokens, num_heads, head_size]
        window = getattr(layer, "sliding_window", None)
        wrapper = md.wrapper if window is None else md.window_wrappers[window]
        ks, vs = layer_kv_scales(layer, kv_cache.dtype)
        scales = dict(k_scale=None if ks == 1.0 else ks, v_scale=None if vs == 1.0 else vs)
        out = wrapper.run(q, kv_cache, **scales)  # [num_tokens, num_heads, head_size]
        return out.reshape(-1, h * d)


def _profile_attention(q, k, v, scale):
    """Plain causal attention over the whole batch (profiling only: shapes, not values)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


FlashInferMetadata.impl = FlashInferImpl
