"""The paged KV cache of one virtual engine on one pipeline stage.

Each local layer gets one tensor in the backend's layout holding ``num_blocks + 1`` blocks:
blocks 0..num_blocks-1 belong to the block manager, block ``num_blocks`` is the scratch block
that padded lanes write to (docs/design.md "Padded lanes"), so a padded write never lands in a
block a request owns.
"""

from __future__ import annotations

import torch

from vllm.attention.backends.abstract import AttentionBackend
from vllm.config import ModelConfig


def cache_block_bytes(
    model_config: ModelConfig,
    block_size: int,
    num_layers: int,
    tp_size: int = 1,
    cache_dtype: torch.dtype | None = None,
) -> int:
    """Bytes of one block across ``num_layers`` layers on one of ``tp_size`` tensor-parallel
    ranks: 2 (K and V) x block_size x this rank's KV heads x head_size x bytes of
    ``cache_dtype`` (the cache's storage dtype; default the model's) x layers."""
    elem = torch.tensor([], dtype=cache_dtype or model_config.torch_dtype).element_size()
    kv_heads = model_config.get_num_kv_heads(tp_size)
    per_layer = 2 * block_size * kv_heads * model_config.head_size * elem
    return per_layer * num_layers


class CacheEngine:
    """Allocates and owns one virtual engine's KV cache on this stage.

    Args:
        model_config: shapes.
        backend: decides the per-layer layout; its ``spec.cache_dtype`` the storage dtype.
        num_blocks: blocks handed to the block manager (scratch block added on top).
        block_size: tokens per block.
        num_layers: layers on this pipeline stage.
        device: where to allocate.
        tp_size: tensor-parallel ranks (this rank holds its share of the KV heads).

    Attributes:
        kv_caches: list (one per local layer) of tensors in ``backend``'s layout.
        scratch_slot: the first slot of the scratch block (num_blocks * block_size).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        backend: AttentionBackend,
        num_blocks: int,
        block_size: int,
        num_layers: int,
        device: torch.device,
        tp_size: int = 1,
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        kv_heads = model_config.get_num_kv_heads(tp_size)
        shape = backend.get_kv_cache_shape(
            num_blocks + 1, block_size, kv_heads, model_config.head_size
        )
        self.kv_caches: list[torch.Tensor] = [
            torch.zeros(shape, dtype=backend.spec.cache_dtype, device=device)
            for _ in range(num_layers)
        ]
        self.scratch_slot = num_blocks * block_size
