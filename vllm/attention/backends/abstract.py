"""The attention-backend interface: metadata, its builder, the kernel impl, graph state.

A backend owns everything about its kernels: the KV-cache layout, how host-side step
information becomes device metadata, the attention computation, and (for CUDA graphs) its
graph-state buffers. Generic code (model runner, graph runner) calls these methods and never
asks which backend it is.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


class ForwardMode(enum.Enum):
    """What one forward pass computes (SGLang-style mode instead of booleans).

    PREFILL: every token of each sequence (prompt, or prompt + outputs when recomputing),
    causal attention among them; with prefix caching a row may start after tokens already
    in the cache (seq_len > query_len), which its new tokens also attend to.
    DECODE: one new token per row, attending to the row's cached context plus itself.
    MIXED: chunked prefill: the first ``StepInputs.num_prefills`` rows are prefill rows
    (whole prompts or chunks, each possibly after cached context), the rest decode rows,
    all in one forward pass.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


@dataclass
class StepInputs:
    """Host-side description of one step, the input of a backend's metadata builder.

    Attributes:
        mode: prefill or decode.
        seq_lens: per row, context length after this step (tokens, including new ones).
        query_lens: per row, number of new tokens (1 for decode; on prefill, below seq_len
            when the row's first seq_len - query_len tokens are cached).
        block_tables: per row, the physical block numbers (decode, and a prefill over a cached
            context) — may be empty lists for padded lanes.
        slot_mapping: per new token, flat KV slot (block * block_size + offset); -1 for
            padded lanes (written to the scratch slot, see docs/design.md "Padded lanes").
        num_real_rows: rows that belong to requests; rows after them are padding.
        graph_prefill: prefill only: ONE row whose tokens were padded at the end to a
            prefill-graph size (padded tokens: slot -1). Its tokens attend causally among
            themselves only, so the real ones never see the padding; the backend runs its
            capturable prefill (the same kernels for a graph replay and for an eager step
            padded alike, so the two agree exactly).
        num_prefills: MIXED only: the leading rows that are prefill rows (their tokens come
            first in ``slot_mapping``); the other rows are decode rows of one token each.
        flat_tables: ``block_tables`` flattened (``host_tables.FlatTables``), filled by the
            first builder that asks (``host_tables.step_tables``) and handed on to the later
            steps of a multi-step call, whose tables are the same lists; None until then.
    """

    mode: ForwardMode
    seq_lens: list[int]
    query_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]
    num_real_rows: int
    graph_prefill: bool = False
    num_prefills: int = 0
    flat_tables: Any = field(default=None, init=False, compare=False, repr=False)

    def split(self) -> tuple[StepInputs, StepInputs]:
        """A MIXED step as (its prefill rows as a PREFILL step, its decode rows as a DECODE
        step); the tokens of the first come first in ``slot_mapping``."""
        p = self.num_prefills
        t = sum(self.query_lens[:p])
        prefill = StepInputs(ForwardMode.PREFILL, self.seq_lens[:p], self.query_lens[:p],
                             self.block_tables[:p], self.slot_mapping[:t], p)  # fmt: skip
        decode = StepInputs(ForwardMode.DECODE, self.seq_lens[p:], self.query_lens[p:],
                            self.block_tables[p:], self.slot_mapping[t:],
                            self.num_real_rows - p)  # fmt: skip
        return prefill, decode

    @classmethod
    def padded_decode(cls, rows: int) -> StepInputs:
        """A decode step of ``rows`` padded lanes only (length 0, no table, slot -1): what
        graph capture runs, so every lane reads and writes only the scratch block."""
        return cls(ForwardMode.DECODE, [0] * rows, [1] * rows, [[] for _ in range(rows)],
                   [-1] * rows, 0)  # fmt: skip

    @classmethod
    def padded_prefill(cls, tokens: int) -> StepInputs:
        """A graph prefill of one row of ``tokens`` padded tokens (slot -1 each): what a
        prefill graph's capture runs, writing only the scratch block."""
        return cls(ForwardMode.PREFILL, [tokens], [tokens], [[]], [-1] * tokens, 0,
                   graph_prefill=True)  # fmt: skip


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
        positions: torch.Tensor | None = None,
        rotary_emb: Any = None,
    ) -> torch.Tensor:
        """Rotate query/key (when ``rotary_emb`` is given), write key/value into
        ``kv_cache`` and attend.

        Args:
            layer: the :class:`vllm.attention.Attention` module (num_heads, num_kv_heads,
                head_size, scale).
            query: [num_tokens, num_heads * head_size]
            key, value: [num_tokens, num_kv_heads * head_size]
            kv_cache: the layer's cache in the backend's layout (possibly empty during
                memory profiling, then nothing is written).
            positions: [num_tokens] int64, with ``rotary_emb`` (a RotaryEmbedding); the
                cached key is the rotated one.
        Returns:
            [num_tokens, num_heads * head_size]
        """


@dataclass
class AttentionSpec:
    """What a backend instance needs to know about the model and the cache.

    Attributes:
        num_heads, num_kv_heads, head_size: attention shapes.
        block_size: tokens per KV block.
        dtype: the model dtype; device: where metadata and buffers live.
        max_seq_len_to_capture: longest context a captured graph serves; block tables of
            graphs are ceil(max_seq_len_to_capture / block_size) wide.
        small_decode_max_rows: FLASHINFER only: the most decode rows its Triton
            small-decode path takes (``CompilationConfig.small_decode_max_rows``; 0 = off).
        sliding_windows: the distinct sliding windows (tokens) of the model's windowed
            layers (each :class:`vllm.attention.Attention` carries its own, or None);
            empty when every layer attends to its whole context.
        scale: the layers' softmax scale when it is not ``head_size ** -0.5`` (Gemma 3's
            ``query_pre_attn_scalar ** -0.5``, Granite's ``attention_multiplier``); None:
            ``head_size ** -0.5``. The model runner checks every layer's scale, window and
            cap against the spec at load (``vllm.attention.layer.check_layers_match_spec``).
        logits_soft_cap: the layers' attention score cap (Gemma), or None.
        kv_cache_dtype: the cache's storage dtype when it is not ``dtype`` (an 8-bit
            float, ``--kv-cache-dtype``; vllm/attention/kv_cache_dtype.py), else None.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    max_seq_len_to_capture: int = 8192
    small_decode_max_rows: int = 1
    sliding_windows: tuple[int, ...] = ()
    scale: float | None = None
    logits_soft_cap: float | None = None
    kv_cache_dtype: torch.dtype | None = None

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype the KV cache tensors are allocated in."""
        return self.kv_cache_dtype or self.dtype

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_seq_len_to_capture // self.block_size)


class AttentionGraphState(ABC):
    """The CUDA-graph state of one backend for ONE virtual engine (docs/design.md guarantee 1).

    Buffers are allocated once per VE at the maximum captured batch size; each captured
    size gets metadata over its own views of them. A full-size buffer handle is never
    rebound to a slice, so capturing size s of VE 1 cannot shrink what VE 0 (or another
    size) captured against.
    """

    def __init__(self, spec: AttentionSpec, scratch_slot: int):
        self.spec = spec
        self.scratch_slot = scratch_slot
        self.scratch_block = scratch_slot // spec.block_size
        self.max_bs = 0

    @abstractmethod
    def allocate(self, max_bs: int) -> None:
        """Allocate this VE's buffers for batches of up to ``max_bs`` decode rows."""

    @abstractmethod
    def metadata_for_capture(self, bs: int) -> AttentionMetadata:
        """Decode metadata for capturing batch size ``bs``: views of the buffers, filled so
        every lane reads and writes only the scratch block (context length 1)."""

    @abstractmethod
    def prepare_replay(self, bs: int, step: StepInputs, metadata: AttentionMetadata) -> None:
        """Fill the buffers behind ``metadata`` (captured at size ``bs``) for ``step``
        (already padded to ``bs`` rows); any planning happens here, outside the graph."""

    def prepare_loop(
        self, bs: int, step: StepInputs, metadata: AttentionMetadata, steps: int
    ) -> None:
        """Like :meth:`prepare_replay`, before the first of ``steps`` replays of a
        decode-loop graph (vllm/cudagraph/decode_loop.py), which :meth:`advance` moves one
        token on after each: a backend that plans on the host plans here once for the
        whole call (every real row grows to ``seq_len + steps - 1`` tokens, within the
        lookahead blocks its table already holds). Default: :meth:`prepare_replay`."""
        self.prepare_replay(bs, step, metadata)

    def allocate_prefill(self, max_tokens: int) -> None:
        """Allocate this VE's prefill-graph buffers for prompts of up to ``max_tokens``
        tokens (only on a backend whose ``supports_prefill_graphs`` is True)."""
        raise NotImplementedError(f"{type(self).__name__} has no prefill graphs")

    def prefill_metadata_for_capture(self, tokens: int) -> AttentionMetadata:
        """Metadata of a graph prefill (``StepInputs.graph_prefill``) of ``tokens`` tokens
        over views of the prefill buffers, every token writing the scratch slot."""
        raise NotImplementedError(f"{type(self).__name__} has no prefill graphs")

    def prepare_prefill_replay(
        self, tokens: int, step: StepInputs, metadata: AttentionMetadata
    ) -> None:
        """Fill the prefill buffers behind ``metadata`` (captured at ``tokens`` tokens) for
        ``step``, a graph prefill already padded to ``tokens`` tokens."""
        raise NotImplementedError(f"{type(self).__name__} has no prefill graphs")

    def advances_on_device(self, metadata: AttentionMetadata) -> bool:
        """Whether :meth:`advance` can move ``metadata`` one token on with device ops alone
        (a backend that plans each step on the host cannot, unless :meth:`prepare_loop`
        plans the whole call). Default: False."""
        return False

    def advance(self, metadata: AttentionMetadata, positions: torch.Tensor) -> None:
        """Inside a decode-loop graph (vllm/cudagraph/decode_loop.py), after a step: every real
        row is one token longer and ``positions`` [bs] int64 already hold the next tokens'
        positions (padded lanes' too); update the buffers behind ``metadata`` (lengths,
        slots) with capturable device ops so the next replay writes and attends one token
        further on real rows, while padded lanes keep touching only the scratch block.

        Raises:
            NotImplementedError: when :meth:`advances_on_device` is False.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot advance on the device")


class AttentionBackend(ABC):
    """A backend instance (one per model runner): cache layout, metadata, impl, graph state.

    Args:
        spec: model/cache shapes, dtype and device.
    """

    name: ClassVar[str]
    # Whether the graph state captures single-sequence prefills (AttentionGraphState's
    # allocate_prefill / prefill_metadata_for_capture / prepare_prefill_replay) and
    # build_metadata accepts StepInputs.graph_prefill steps.
    supports_prefill_graphs: ClassVar[bool] = False

    def __init__(self, spec: AttentionSpec):
        self.spec = spec

    def loop_max_rows(self) -> int:
        """The most decode rows whose graph state :meth:`AttentionGraphState.advance` can
        move on the device, so decode-loop graphs (vllm/cudagraph/decode_loop.py) are
        captured up to this size. Default 0: none."""
        return 0

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """Shape of one layer's cache holding ``num_blocks`` blocks."""

    @abstractmethod
    def build_metadata(self, step: StepInputs, scratch_slot: int) -> AttentionMetadata:
        """Turn host step information into device metadata (eager path)."""

    @abstractmethod
    def make_graph_state(self, scratch_slot: int) -> AttentionGraphState:
        """A new graph state for one virtual engine whose scratch slot is ``scratch_slot``."""
