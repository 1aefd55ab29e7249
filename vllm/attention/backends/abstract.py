"""The attention-backend interface: metadata, its builder, the kernel impl, graph state.

A backend owns everything about its kernels: the KV-cache layout, how host-side step
information becomes device metadata, the attention computation, and (for CUDA graphs) its
graph-state buffers. Generic code (model runner, graph runner) calls these methods and never
asks which backend it is.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


class ForwardMode(enum.Enum):
    """What one forward pass computes (SGLang-style mode instead of booleans).

    PREFILL: every token of each sequence (prompt, or prompt + outputs when recomputing),
    causal attention among them; no earlier KV cache is read.
    DECODE: one new token per row, attending to the row's cached context plus itself.
    """

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class StepInputs:
    """Host-side description of one step, the input of a backend's metadata builder.

    Attributes:
        mode: prefill or decode.
        seq_lens: per row, context length after this step (tokens, including new ones).
        query_lens: per row, number of new tokens (1 for decode).
        block_tables: per row, the physical block numbers (decode) — may be empty lists for
            padded lanes.
        slot_mapping: per new token, flat KV slot (block * block_size + offset); -1 for
            padded lanes (written to the scratch slot, see DESIGN.md "Padded lanes").
        num_real_rows: rows that belong to requests; rows after them are padding.
    """

    mode: ForwardMode
    seq_lens: list[int]
    query_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]
    num_real_rows: int


@dataclass
class AttentionMetadata:
    """Device metadata of one forward pass, shared by every attention layer.

    Attributes:
        mode: prefill or decode.
        num_rows: batch rows (sequences), padded lanes included.
        num_tokens: new tokens in the pass.
        slot_mapping: [num_tokens] int64, KV slot per new token; padded lanes hold
            ``scratch_slot``.
        scratch_slot: the reserved slot padded lanes write to (first slot of the scratch
            block, index num_blocks of the cache).
    """

    impl: ClassVar[Any] = None
    mode: ForwardMode
    num_rows: int
    num_tokens: int
    slot_mapping: torch.Tensor
    scratch_slot: int


class AttentionImpl(ABC):
    """The attention computation of one backend (stateless; layer params come from ``layer``)."""

    @staticmethod
    @abstractmethod
    def forward(
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Write key/value into ``kv_cache`` and attend.

        Args:
            layer: the :class:`vllm.attention.Attention` module (num_heads, num_kv_heads,
                head_size, scale).
            query: [num_tokens, num_heads * head_size]
            key, value: [num_tokens, num_kv_heads * head_size]
            kv_cache: the layer's cache in the backend's layout (possibly empty during
                memory profiling, then nothing is written).
        Returns:
            [num_tokens, num_heads * head_size]
        """


class AttentionBackend(ABC):
    """A backend: name, cache layout, metadata builder, impl and graph state."""

    name: ClassVar[str]

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """Shape of one layer's cache holding ``num_blocks`` blocks."""

    @staticmethod
    @abstractmethod
    def build_metadata(
        step: StepInputs, device: torch.device, block_size: int, scratch_slot: int
    ) -> AttentionMetadata:
        """Turn host step information into device metadata (eager path)."""

    @classmethod
    def get_state_cls(cls) -> type:
        """The backend's CUDA-graph state class (see vllm/attention/backends/graph_state.py)."""
        raise NotImplementedError(f"{cls.name} does not support CUDA graphs")
