"""FLASHINFER: paged attention through FlashInfer's batch prefill and decode wrappers.

KV-cache layout per layer: [num_blocks + 1, 2, block_size, num_kv_heads, head_size]
("NHD", key at index 0 of dim 1); block ``num_blocks`` is the scratch block.

Planning (``wrapper.plan``) takes pinned host tensors (FlashInfer plans on the host and
copies them to its device buffers without blocking), except a graph replay's page indices,
which are uploaded first (FlashInfer copies host indices into a graph buffer with a
blocking copy); so no step waits on the device.
flashinfer is imported lazily; the wrapper classes are parameters of the backend so the
CUDA-graph state runs on CPU in tests with a fake decode wrapper (same constructor and
``plan`` checks as FlashInfer's).

CUDA-graph state (per virtual engine buffers and per-size decode wrappers) lives in
:mod:`vllm.attention.backends.flashinfer_graph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.attention.backends.abstract import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    AttentionSpec,
    ForwardMode,
    StepInputs,
)
from vllm.attention.backends.host_tables import (
    exclusive_cumsum,
    flatten_tables,
    ragged_positions,
    scratch_slots,
)
from vllm.attention.backends.small_decode import SmallDecodeBuffers, small_decode_max_rows
from vllm.utils import to_device

WORKSPACE_BYTES = 128 * 1024 * 1024


def _wrapper_classes() -> tuple[type, type]:
    import flashinfer

    return (
        flashinfer.BatchPrefillWithPagedKVCacheWrapper,
        flashinfer.BatchDecodeWithPagedKVCacheWrapper,
    )


def use_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    """FlashInfer's CUDA-core decode kernels cover GQA group sizes 1, 2, 4 and 8 only."""
    return (num_heads // num_kv_heads) not in (1, 2, 4, 8)


@dataclass
class FlashInferMetadata(AttentionMetadata):
    """Metadata of FLASHINFER: the planned wrapper of this pass (prefill or decode) and
    ``kv_rows`` [2, num_tokens] int64, the rows of each new token's key (row 0) and value
    (row 1) in the cache viewed as [(num_blocks + 1) * 2 * block_size, kv_heads, head_size]
    (see :func:`slot_rows_host`), so a layer writes its cache with two index copies."""

    wrapper: Any = None
    kv_rows: torch.Tensor | None = None


def slot_rows_host(slots: list[int], scratch_slot: int, block_size: int) -> torch.Tensor:
    """[3, num_tokens] int64 host tensor: the slot mapping with padded lanes (-1) sent to
    ``scratch_slot``, then each slot's key row and value row in the flat cache view.

    Layout [num_blocks + 1, 2, block_size, ...]: block b holds its keys at flat rows
    ``2*b*block_size + [0, block_size)`` and its values right after, so slot
    ``s = b*block_size + o`` has key row ``2*b*block_size + o = s + b*block_size`` and
    value row ``key row + block_size``.
    """
    rows = np.empty((3, len(slots)), dtype=np.int64)  # [3, num_tokens]
    rows[0] = scratch_slots(slots, scratch_slot)
    np.add(rows[0], (rows[0] // block_size) * block_size, out=rows[1])
    np.add(rows[1], block_size, out=rows[2])
    return torch.from_numpy(rows)


def write_kv(
    kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_rows: torch.Tensor
) -> None:
    """Scatter keys/values into the NHD paged cache (two index copies, no index math).

    kv_cache: [num_blocks + 1, 2, block_size, num_kv_heads, head_size];
    key, value: [num_tokens, num_kv_heads, head_size]; kv_rows: [2, num_tokens] int64 rows
    of the flat view (padded lanes already redirected to the scratch slot).
    """
    flat = kv_cache.view(-1, kv_cache.shape[-2], kv_cache.shape[-1])  # [rows, kv_heads, D]
    flat.index_copy_(0, kv_rows[0], key)
    flat.index_copy_(0, kv_rows[1], value)


def rotate_and_write(
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_rows: torch.Tensor,
    positions: torch.Tensor | None,
    rotary_emb: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query / key (when ``rotary_emb`` is given) and write key / value into the NHD
    cache at ``kv_rows`` [2, num_tokens] (see :func:`write_kv`): on CUDA one fused kernel
    does both; elsewhere the rotation, then two index copies.

    query: [num_tokens, num_heads * head_size]; key, value: [num_tokens, num_kv_heads *
    head_size]. Returns (query, key) rotated, same shapes (the cached key is the rotated one).
    """
    h_kv, d = layer.num_kv_heads, layer.head_size
    written = False
    if rotary_emb is not None:  # on CUDA one kernel rotates and writes the cache rows
        flat = kv_cache.view(-1, h_kv * d)  # [(num_blocks + 1) * 2 * block_size, ...]
        query, key, written = rotary_emb.forward_and_cache(
            positions, query, key, value, flat, kv_rows
        )
    if not written:
        write_kv(kv_cache, key.view(-1, h_kv, d), value.view(-1, h_kv, d), kv_rows)
    return query, key


class FlashInferImpl(AttentionImpl):
    """Runs the planned wrapper of the pass."""

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
        out = md.wrapper.run(q, kv_cache)  # [num_tokens, num_heads, head_size]
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


def paged_kv_host(
    step: StepInputs, block_size: int, scratch_block: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host (pinned when CUDA is present) int32 ``indptr`` [rows + 1], ``indices`` [pages]
    and ``last_page_len`` [rows] of a step.

    Row i uses the first ceil(seq_len / block_size) blocks of its table (clipped to
    ``width`` blocks when ``width`` is a positive count; None or 0 clips nothing); a padded
    lane (seq_len 0) uses the scratch block with length 1. A row with seq_len > 0 and an
    empty table (memory profiling: planned over the scratch block and never run) uses the
    scratch block ceil(seq_len / block_size) times. ``last_page_len`` is the row's length
    minus the tokens of all its pages but the last (so a clipped or short table gives a
    value above ``block_size``, as the list-based builder did).

    Whole-array work: the tables are flattened once (see ``host_tables``), each row's page
    count and tail are computed for all rows at once, and the pages are the rows' table
    prefixes selected by a mask, with scratch pages where a row has no table.
    """
    rows = min(len(step.seq_lens), len(step.block_tables))  # zip() of the two lists
    tables = step.block_tables if rows == len(step.block_tables) else step.block_tables[:rows]
    seq = np.fromiter(step.seq_lens, dtype=np.int64, count=rows)  # [rows]
    flat, tlen = flatten_tables(tables, np.int32)  # [table entries] int32, [rows] int64
    real = seq > 0  # [rows] False on padded lanes
    # A padded lane is then a one-token row without a table: one scratch page, length 1.
    n = np.maximum(seq, 1)  # [rows]
    need = (n + (block_size - 1)) // block_size  # [rows] pages that cover the row
    take = np.minimum(need, tlen * real)  # [rows] table prefix used; 0: scratch pages
    if width:
        np.minimum(take, width, out=take)
    from_table = take > 0  # [rows]
    count = np.where(from_table, take, need)  # [rows] pages per row
    last = n - (count - 1) * block_size  # [rows]
    indptr = exclusive_cumsum(count)  # [rows + 1]
    # take <= tlen, so equal totals with every row on its table mean whole tables
    if int(indptr[-1]) == len(flat) and from_table.all():
        indices = flat  # every row uses its whole table: nothing to select
    else:
        # each row's first `take` table entries, in row order
        keep = ragged_positions(tlen, exclusive_cumsum(tlen)) < np.repeat(take, tlen)
        indices = np.full(int(indptr[-1]), scratch_block, dtype=np.int32)  # [pages]
        indices[np.repeat(from_table, count)] = flat[keep]
    indptr_t, indices_t, last_t = _host_i32(indptr, indices, last)
    return indptr_t, indices_t, last_t


def _host_i32(*arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
    """int32 host tensors of ``arrays`` (1-D each), pinned when CUDA is present (for
    non-blocking uploads): one buffer holds them back to back, converted and pinned once,
    and each returned tensor is a contiguous view of its part."""
    buf = np.concatenate(arrays, dtype=np.int32, casting="same_kind")  # [sum of lengths]
    t = torch.from_numpy(buf)
    if torch.cuda.is_available():
        t = t.pin_memory()
    return tuple(t.split_with_sizes([len(a) for a in arrays]))


class FlashInferBackend(AttentionBackend):
    """The FLASHINFER backend (default on CUDA for float16/bfloat16).

    Args:
        spec: shapes, dtype, device.
        prefill_wrapper_cls, decode_wrapper_cls: FlashInfer's wrapper classes (imported
            lazily when None; tests pass fakes).
    """

    name = "FLASHINFER"
    supports_prefill_graphs = True  # vllm/attention/backends/flashinfer_prefill.py

    def __init__(
        self,
        spec: AttentionSpec,
        prefill_wrapper_cls: type | None = None,
        decode_wrapper_cls: type | None = None,
    ):
        super().__init__(spec)  # float32 is refused by the selector during validation
        if prefill_wrapper_cls is None or decode_wrapper_cls is None:
            p, d = _wrapper_classes()
            prefill_wrapper_cls = prefill_wrapper_cls or p
            decode_wrapper_cls = decode_wrapper_cls or d
        self.prefill_wrapper_cls = prefill_wrapper_cls
        self.decode_wrapper_cls = decode_wrapper_cls
        self.tensor_cores = use_tensor_cores(spec.num_heads, spec.num_kv_heads)
        self._workspace = None
        self._prefill = None
        self._decode = None
        self.prefill_runs = 0
        self.decode_runs = 0
        self.small_decode_runs = 0  # decode steps on the Triton small-batch path
        self.graph_prefill_runs = 0  # graph prefills (replayed or padded eager), no wrapper
        self.small_max_rows = small_decode_max_rows()
        self._small: SmallDecodeBuffers | None = None

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    def workspace(self) -> torch.Tensor:
        """FlashInfer's float workspace [WORKSPACE_BYTES] uint8 (scratch of split-KV runs),
        allocated once and shared by the eager wrappers and every VE's graph wrappers, as
        upstream vLLM shares it: a worker runs all its attention on one CUDA stream, one
        pass at a time, and plan information lives in each wrapper's own int workspace."""
        if self._workspace is None:
            self._workspace = torch.zeros(
                WORKSPACE_BYTES, dtype=torch.uint8, device=self.spec.device
            )
        return self._workspace

    def _eager_wrappers(self):
        if self._prefill is None:
            ws = self.workspace()
            self._prefill = self.prefill_wrapper_cls(ws, "NHD")
            self._decode = self.decode_wrapper_cls(ws, "NHD", use_tensor_cores=self.tensor_cores)
        return self._prefill, self._decode

    def plan_kwargs(self) -> dict[str, Any]:
        s = self.spec
        return dict(
            num_qo_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            page_size=s.block_size,
            q_data_type=s.dtype,
            kv_data_type=s.dtype,
            sm_scale=s.head_size**-0.5,
        )

    def small(self) -> SmallDecodeBuffers:
        """The small-batch decode path's buffers (created on first use)."""
        if self._small is None:
            self._small = SmallDecodeBuffers(self.spec, self.small_max_rows)
        return self._small

    def takes_small_path(self, mode: ForwardMode, rows: int) -> bool:
        """Whether a step of ``rows`` rows (padded ones included) runs the Triton small
        decode kernel (vllm/attention/backends/small_decode.py) instead of FlashInfer."""
        return mode == ForwardMode.DECODE and 0 < rows <= self.small_max_rows

    def build_metadata(self, step: StepInputs, scratch_slot: int) -> AttentionMetadata:
        if self.takes_small_path(step.mode, len(step.seq_lens)):
            self.small_decode_runs += 1
            return self.small().build_metadata(step, scratch_slot)
        if step.graph_prefill:  # an eager step padded like a prefill graph: same kernels
            from vllm.attention.backends.flashinfer_prefill import graph_prefill_metadata

            self.graph_prefill_runs += 1
            rows = slot_rows_host(step.slot_mapping, scratch_slot, self.spec.block_size)
            return graph_prefill_metadata(to_device(rows, self.spec.device), scratch_slot)
        prefill, decode = self._eager_wrappers()
        indptr, indices, last = paged_kv_host(
            step, self.spec.block_size, scratch_slot // self.spec.block_size
        )
        kw = self.plan_kwargs()
        if step.mode == ForwardMode.PREFILL:
            qo = torch.zeros(len(step.query_lens) + 1, dtype=torch.int32)
            qo[1:] = torch.tensor(step.query_lens, dtype=torch.int32).cumsum(0)
            prefill.plan(
                qo, indptr, indices, last, head_dim_qk=self.spec.head_size, causal=True, **kw
            )
            wrapper = prefill
            self.prefill_runs += 1
        else:
            decode.plan(indptr, indices, last, head_dim=self.spec.head_size, **kw)
            wrapper = decode
            self.decode_runs += 1
        rows = to_device(
            slot_rows_host(step.slot_mapping, scratch_slot, self.spec.block_size),
            self.spec.device,
        )  # [3, num_tokens]
        return FlashInferMetadata(
            mode=step.mode,
            num_rows=len(step.seq_lens),
            num_tokens=len(step.slot_mapping),
            slot_mapping=rows[0],
            scratch_slot=scratch_slot,
            wrapper=wrapper,
            kv_rows=rows[1:],
        )

    def make_graph_state(self, scratch_slot: int) -> Any:
        """A :class:`~vllm.attention.backends.flashinfer_graph.FlashInferGraphState`."""
        from vllm.attention.backends.flashinfer_graph import FlashInferGraphState

        return FlashInferGraphState(self, scratch_slot)


FlashInferMetadata.impl = FlashInferImpl
