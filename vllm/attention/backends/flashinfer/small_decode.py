"""FLASHINFER's small-batch decode path: decode steps of at most ``small_decode_max_rows``
rows run the one-launch Triton kernel of :mod:`vllm.kernels.decode_attention` instead of
FlashInfer's rotary + decode + merge kernels.

Why: at one to a few rows a step is bound by launches and host work, not by bytes.
FlashInfer plans every decode step on the host (~0.16 ms) and runs three kernels per layer;
this path uploads the lengths and block tables (one copy, no plan) and runs one kernel per
layer, and its metadata lives in device buffers that a captured graph advances by itself
(``advance``), which the decode-loop graphs need.

The choice depends on the row count only (padded rows included), the same for eager steps
and graph replays, so graphs and --enforce-eager run the same kernel. Prefill and larger
decode batches stay on FlashInfer. ``CompilationConfig.small_decode_max_rows``
(``--small-decode-max-rows``, reaching the backend as ``AttentionSpec.small_decode_max_rows``)
sets the limit (default 1: one-row decode steps take this path; 0 turns it off, 8 takes up
to 8 rows).

Why one row by default (H200, bf16): on the Llama-3.1-8B shape at
batch 1 every run on this path beat every run on FlashInfer's wrappers (floor ratios
0.729-0.745 over six runs, against 0.710-0.722), since its one PDL launch a layer
overlaps the projections around it. On SmolLM2 at batch 1 the two were within 2% (888 /
893 against 905 / 902 tok/s, measured with the PDL trigger before the wait; triggering after
the wait, the kernels' rule, makes this path's layer chain 21% faster). Above one
row the wrappers stay the default: no settled gain was measured there, and
the nano workload (Qwen2.5-0.5B shape) fell from 34.5k to 27.6k tok/s with an untuned
version of the kernel at up to 8 rows. From 64 rows on, FlashInfer's decode is 1.4-10x
faster a layer even with the kernel's batch-aware split cap (docs/benchmarks.md,
"Small-decode kernel at larger batches").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.attention.backends.abstract import (
    AttentionImpl,
    AttentionMetadata,
    AttentionSpec,
    ForwardMode,
    StepInputs,
)
from vllm.attention.backends.host_tables import step_tables
from vllm.kernels import dispatch
from vllm.utils import to_device

SMALL_DECODE_MAX_ROWS_LIMIT = 64  # as CompilationConfig.small_decode_max_rows allows


@dataclass
class SmallDecodeMetadata(AttentionMetadata):
    """Metadata of a small decode step.

    Attributes:
        seq_lens: [num_rows] int32 context length with the new token; 0 on padded lanes.
        block_tables: [num_rows, width] int32 blocks of each row (zeros past its table).
        block_size: tokens per block.
        max_seq_len: a bound on every row's length, which sizes the kernel's grid (the
            graph's max_seq_len_to_capture, or the step's longest row).
        workspace: the backend's ``decode_attention.DecodeWorkspace``.
    ``slot_mapping`` is unused (the kernel derives each slot from the table and position).
    """

    seq_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    block_size: int = 16
    max_seq_len: int = 1
    workspace: Any = None


class SmallDecodeImpl(AttentionImpl):
    """One kernel: rotate q/k, write the new key/value, attend (decode_attention)."""

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
        md: SmallDecodeMetadata = attn_metadata  # type: ignore[assignment]
        cos_sin = None if rotary_emb is None else rotary_emb.cos_sin_cache
        if rotary_emb is not None and not rotary_emb.whole_head_halves:
            # the kernel rotates whole heads by halves: a partial rotary (Phi-4-mini) or an
            # interleaved one (GLM-4) runs first, in its own kernel reading the same
            # positions, and the kernel rotates nothing
            query, key = rotary_emb(positions, query, key)
            cos_sin = None
        return dispatch.decode_attention().paged_decode_attention(
            query, key, value, positions, cos_sin, kv_cache, md.block_tables, md.seq_lens,
            md.workspace, layer.num_heads, layer.scale, md.scratch_slot // md.block_size,
            md.max_seq_len,
        )  # fmt: skip


SmallDecodeMetadata.impl = SmallDecodeImpl


def small_decode_host(step: StepInputs, fill: int, width: int | None = None) -> np.ndarray:
    """[rows + rows * width] int32: the rows' lengths (0 on padded lanes), then their block
    tables padded with block ``fill`` (the scratch block) to ``width`` (default: the longest
    table; clipped to it), so one upload fills both buffers. A padded lane's table is all
    ``fill``: should a loop graph advance it, it still writes only the scratch block."""
    rows = len(step.seq_lens)
    ft = step_tables(step)  # flattened once per call (a multi-step call's steps share it)
    flat, tlen = ft.head(rows)  # [entries], [rows] int64
    if width is None:
        width = max(1, int(tlen.max(initial=0)))
    buf = np.full(rows + rows * width, fill, dtype=np.int32)
    buf[:rows] = step.seq_lens
    if len(flat):
        col = ft.cols[: len(flat)]  # [entries]
        keep = col < width
        dest = rows + np.repeat(np.arange(rows, dtype=np.int64) * width, tlen) + col
        buf[dest[keep]] = flat[keep]
    return buf


class SmallDecodeBuffers:
    """The device side of small decode steps for one backend instance.

    Args:
        spec: model/cache shapes.
        max_rows: the most rows (``AttentionSpec.small_decode_max_rows``).
    """

    def __init__(self, spec: AttentionSpec, max_rows: int):
        self.spec = spec
        self.max_rows = max_rows
        self.workspace = dispatch.decode_attention().DecodeWorkspace(
            max_rows, spec.num_heads, spec.num_kv_heads, spec.head_size, spec.device
        )

    def build_metadata(self, step: StepInputs, scratch_slot: int) -> SmallDecodeMetadata:
        """Eager metadata of a decode ``step`` of at most ``max_rows`` rows (one upload)."""
        rows = len(step.seq_lens)
        fill = scratch_slot // self.spec.block_size
        host = torch.from_numpy(small_decode_host(step, fill))
        dev = to_device(host, self.spec.device)  # [rows + rows * width]
        return self._metadata(dev[:rows], dev[rows:].view(rows, -1), scratch_slot,
                              max(step.seq_lens, default=1))  # fmt: skip

    def _metadata(self, lens, tables, scratch_slot: int, bound: int) -> SmallDecodeMetadata:
        rows = lens.shape[0]
        return SmallDecodeMetadata(
            mode=ForwardMode.DECODE, num_rows=rows, num_tokens=rows,
            slot_mapping=lens, scratch_slot=scratch_slot, seq_lens=lens, block_tables=tables,
            block_size=self.spec.block_size, max_seq_len=bound,
            workspace=self.workspace,
        )  # fmt: skip


class SmallDecodeGraphBuffers:
    """One virtual engine's graph buffers of the small path: lengths [rows] and block tables
    [rows, max_blocks_per_seq] (int32), allocated once; sizes take views of them.

    Args:
        small: the backend's :class:`SmallDecodeBuffers`.
        rows: how many rows to allocate (min of the graph maximum and ``small.max_rows``).
        scratch_slot: this VE's scratch slot.
    """

    def __init__(self, small: SmallDecodeBuffers, rows: int, scratch_slot: int):
        self.small = small
        self.rows = rows
        self.scratch_slot = scratch_slot
        self.width = small.spec.max_blocks_per_seq
        # [lengths | tables] back to back, so one upload refills both
        self.buffer = torch.full((rows * (1 + self.width),), scratch_slot // small.spec.block_size,
                                 dtype=torch.int32, device=small.spec.device)  # fmt: skip
        self.seq_lens = self.buffer[:rows]  # [rows]
        self.seq_lens.zero_()
        self.block_tables = self.buffer[rows:].view(rows, self.width)  # [rows, width]

    def metadata(self, bs: int) -> SmallDecodeMetadata:
        """Metadata over this size's views (lengths 0: every lane writes the scratch slot)."""
        return self.small._metadata(
            self.seq_lens[:bs], self.block_tables[:bs], self.scratch_slot,
            self.small.spec.max_seq_len_to_capture,
        )  # fmt: skip

    def prepare(self, bs: int, step: StepInputs) -> None:
        """Upload ``step`` (``bs`` rows, padded) into the views of size ``bs``."""
        fill = self.scratch_slot // self.small.spec.block_size
        host = torch.from_numpy(small_decode_host(step, fill, self.width))  # [bs * (1 + width)]
        if self.buffer.is_cuda:
            host = host.pin_memory()
        self.seq_lens[:bs].copy_(host[:bs], non_blocking=True)
        self.block_tables[:bs].copy_(host[bs:].view(bs, self.width), non_blocking=True)

    @staticmethod
    def advance(metadata: SmallDecodeMetadata) -> None:
        """One token later on every real row; padded lanes (length 0) stay idle (inside a
        decode-loop graph: device ops only)."""
        lens = metadata.seq_lens  # [rows] int32, >= 0
        lens.add_(lens.clamp(max=1))  # +1 where > 0: two kernels (a compare and a cast: three)
