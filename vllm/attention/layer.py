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
        sliding_window: when set, each query attends only to the ``sliding_window`` most
            recent positions, itself included (key position > query position - window, as
            transformers' sliding-window mask); None: the whole causal context.
        logits_soft_cap: when set, attention scores become ``cap * tanh(scores / cap)``
            before the softmax (Gemma); None: no capping.

    Raises:
        ValueError: num_heads not a multiple of num_kv_heads, a window below 1 or a cap
            that is not positive.

    The backend is known from the metadata (``attn_metadata.impl``), so models never
    branch on it and no global is consulted.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        prefix: str = "",
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ):
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}."
            )
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be at least 1 (or None).")
        if logits_soft_cap is not None and not logits_soft_cap > 0:
            raise ValueError(f"logits_soft_cap={logits_soft_cap} must be positive (or None).")
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
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
