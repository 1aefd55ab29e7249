"""FLASHINFER's graph prefill: one sequence, padded to a prefill-graph size, in a CUDA graph.

A batch-1 prefill of a small model is host-bound when run eagerly: about 10 launches per
layer, FlashInfer's planned ``run`` among them, cost ~0.5 ms of host time per layer against
~30 us of GPU work (SmolLM2, 128 tokens: 14-19 ms per prompt on an H200). A graph replays
the whole forward in one launch. FlashInfer's prefill wrapper plans on the host per step,
so the graph prefill attends without it: a prefill reads no earlier KV cache (``ForwardMode``),
so the row's own new keys and values are all it needs, and one causal SDPA call over them
(:func:`vllm.attention.backends.torch_sdpa.causal_prefill`) is capturable. The cache write
is the backend's usual one (the fused rotary + write kernel over ``kv_rows``); padded
tokens write the scratch slot, and, being after the real tokens, are never attended to by
them (causal). A layer's sliding window and score cap apply as on TORCH_SDPA, and with an
8-bit cache the attention reads the keys and values as the wrappers read them back from
the cache: divided by the layer's k_scale / v_scale, rounded, multiplied back.

Eager steps padded the same way (``ModelRunner.pad_eager_batches``) build this metadata
too, so graph and eager run the same kernels on the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm.attention.backends.abstract import AttentionImpl, AttentionMetadata, ForwardMode
from vllm.attention.backends.flashinfer.paged_cache import rotate_and_write
from vllm.attention.backends.sdpa_ops import layer_window
from vllm.attention.backends.torch_sdpa import causal_prefill
from vllm.attention.kv_cache_dtype import as_stored, layer_kv_scales


@dataclass
class GraphPrefillMetadata(AttentionMetadata):
    """Metadata of a FLASHINFER graph prefill (``StepInputs.graph_prefill``): one row of
    ``num_tokens`` tokens, padding included; ``kv_rows`` [2, num_tokens] int64 key and
    value rows of each token in the flat cache view (padded tokens: the scratch slot's),
    as ``FlashInferMetadata.kv_rows``."""

    kv_rows: torch.Tensor | None = None


def graph_prefill_metadata(rows: torch.Tensor, scratch_slot: int) -> GraphPrefillMetadata:
    """Metadata over ``rows`` [3, tokens] int64 (slot, key row, value row per token; see
    ``paged_cache.slot_rows_host``), a device tensor or a view of a graph buffer."""
    tokens = int(rows.shape[1])
    return GraphPrefillMetadata(
        mode=ForwardMode.PREFILL,
        num_rows=1,
        num_tokens=tokens,
        slot_mapping=rows[0],
        scratch_slot=scratch_slot,
        kv_rows=rows[1:],
    )


class GraphPrefillImpl(AttentionImpl):
    """Rotate, write the cache rows, then causal attention among the row's own tokens."""

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
        md: GraphPrefillMetadata = attn_metadata  # type: ignore[assignment]
        h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        query, key = rotate_and_write(layer, query, key, value, kv_cache, md.kv_rows, positions,
                                      rotary_emb)  # fmt: skip
        q = query.view(-1, h, d)  # [num_tokens, num_heads, head_size]
        k = key.view(-1, h_kv, d)  # [num_tokens, num_kv_heads, head_size]
        v = value.view(-1, h_kv, d)  # [num_tokens, num_kv_heads, head_size]
        ks, vs = layer_kv_scales(layer, kv_cache.dtype)
        k, v = as_stored(k, kv_cache.dtype, ks), as_stored(v, kv_cache.dtype, vs)  # as cached
        window, cap = layer_window(layer)
        out = causal_prefill(q, k, v, [0, md.num_tokens], layer.scale, window, cap)
        return out.reshape(-1, h * d)  # [num_tokens, num_heads * head_size]


GraphPrefillMetadata.impl = GraphPrefillImpl
