"""The attention layer used by every model: a thin module that delegates to the backend."""

from __future__ import annotations

import torch
from torch import nn

from vllm.attention.backends.abstract import AttentionMetadata


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads over a paged KV cache.

    Args:
        num_heads: query heads.
        head_size: channels per head.
        scale: softmax scale (head_size ** -0.5 for Llama/Qwen2).
        num_kv_heads: key/value heads (num_heads must be a multiple of it).
        prefix: the module's name, for logs.

    The backend is known from the metadata (``attn_metadata.impl``), so models never
    branch on it and no global is consulted.
    """

    def __init__(
        self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, prefix: str = ""
    ):
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}."
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.prefix = prefix

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        positions: torch.Tensor | None = None,
        rotary_emb: nn.Module | None = None,
    ) -> torch.Tensor:
        """query [T, num_heads*head_size], key/value [T, num_kv_heads*head_size]
        -> [T, num_heads*head_size]; writes key/value into ``kv_cache``.

        With ``rotary_emb`` (a RotaryEmbedding) and ``positions`` [T] int64, query and key
        are rotated first, by the backend, which may fuse the rotation with its cache write.
        """
        return attn_metadata.impl.forward(
            self, query, key, value, kv_cache, attn_metadata, positions, rotary_emb
        )
