"""TORCH_SDPA: the reference backend over a paged KV cache, on CPU and CUDA.

KV-cache layout per layer: [2, num_blocks + 1, block_size, num_kv_heads, head_size]; index 0
holds keys, 1 values, and block ``num_blocks`` is the scratch block padded lanes write to.

Prefill attends causally among each sequence's new tokens; a row whose first tokens are
already in the cache (prefix caching: its seq_len exceeds its query_len) gathers its whole
context through its block table after the step's keys were written, and each new token
attends to every cached token and causally among the new ones. A MIXED step (chunked
prefill) runs its prefill rows as a prefill and its decode rows as a decode, over one cache
write. Decode gathers each row's blocks through a block table of fixed width and masks
positions at or beyond the row's length, which keeps every shape static and so is CUDA-graph
capturable (docs/design.md "Devices and backends"). A layer's ``sliding_window`` and
``logits_soft_cap`` (:class:`vllm.attention.Attention`) narrow the masks and cap the scores
(``sdpa_ops``). With an 8-bit cache (``--kv-cache-dtype fp8``) keys and values are
stored divided by the layer's ``k_scale`` / ``v_scale`` and rounded, and every path
attends to the stored values times the scales, a prefill's own new keys included
(vllm/attention/kv_cache_dtype.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.attention.backends.abstract import (
    AttentionBackend,
    AttentionGraphState,
    AttentionImpl,
    AttentionMetadata,
    ForwardMode,
    StepInputs,
)
from vllm.attention.backends.host_tables import scratch_slots, step_tables
from vllm.attention.backends.sdpa_context import context_prefill
from vllm.attention.backends.sdpa_ops import attend, causal_attend, layer_window, window_mask
from vllm.attention.kv_cache_dtype import from_cache, layer_kv_scales, store_rows, to_cache
from vllm.utils import to_device


@dataclass
class TorchSDPAMetadata(AttentionMetadata):
    """Metadata of TORCH_SDPA.

    Attributes:
        seq_lens: [num_rows] int64 context length per row (decode: the mask length).
        block_tables: [num_rows, max_blocks] int64 (decode, and a prefill with cached
            context; padded lanes point at the scratch block).
        query_start_loc: host list of num_rows + 1 token offsets (prefill only).
        max_seq_len: longest row context in tokens.
        context_lens: prefill with cached context only: host list, per row, tokens already
            in the cache before this step (seq_len - query_len); None when no row has any.
        prefill_part, decode_part: MIXED only: the metadata of its prefill rows and of its
            decode rows (their slot mappings unused: the step writes its cache once).
    """

    seq_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    query_start_loc: list[int] | None = None
    max_seq_len: int = 0
    context_lens: list[int] | None = None
    prefill_part: TorchSDPAMetadata | None = None
    decode_part: TorchSDPAMetadata | None = None


def write_kv(
    kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, md: AttentionMetadata
) -> None:
    """Scatter new keys/values into the paged cache at ``md.slot_mapping``: as they are
    when already in the cache's dtype (the caller scaled and rounded them with
    ``kv_cache_dtype.to_cache``), else rounded to it (``kv_cache_dtype.store_rows``).

    Args:
        kv_cache: [2, num_blocks + 1, block_size, num_kv_heads, head_size]
        key, value: [num_tokens, num_kv_heads, head_size]
    Padded lanes' slots already hold ``md.scratch_slot`` (never -1: it would wrap to the
    last real slot).
    """
    n_kv, d = key.shape[1], key.shape[2]
    key_cache = kv_cache[0].view(-1, n_kv, d)  # [num_slots, num_kv_heads, head_size]
    value_cache = kv_cache[1].view(-1, n_kv, d)  # [num_slots, num_kv_heads, head_size]
    store_rows(key_cache, md.slot_mapping, key)
    store_rows(value_cache, md.slot_mapping, value)


class TorchSDPAImpl(AttentionImpl):
    """Attention through torch.nn.functional.scaled_dot_product_attention."""

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
        md: TorchSDPAMetadata = attn_metadata  # type: ignore[assignment]
        if rotary_emb is not None:
            query, key = rotary_emb(positions, query, key)
        h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
        q = query.view(-1, h, d)  # [num_tokens, num_heads, head_size]
        k = key.view(-1, h_kv, d)  # [num_tokens, num_kv_heads, head_size]
        v = value.view(-1, h_kv, d)  # [num_tokens, num_kv_heads, head_size]
        ks, vs = layer_kv_scales(layer, kv_cache.dtype)  # (1.0, 1.0) unless 8-bit
        if kv_cache.numel() > 0:
            # scaled and rounded once, as the cache stores them (itself for a cache of the
            # model's dtype): written, and attended to as read back
            k8, v8 = to_cache(k, kv_cache.dtype, ks), to_cache(v, kv_cache.dtype, vs)
            write_kv(kv_cache, k8, v8, md)
            k, v = from_cache(k8, q.dtype, ks), from_cache(v8, q.dtype, vs)
        window, cap = layer_window(layer)
        scales = (ks, vs)
        if md.mode == ForwardMode.MIXED:
            t = md.prefill_part.num_tokens  # prefill tokens come first
            p_out = _prefill(q[:t], k[:t], v[:t], kv_cache, md.prefill_part, layer.scale,
                             window, cap, scales)  # fmt: skip
            d_out = _decode(q[t:], kv_cache, md.decode_part, layer.scale, window, cap, scales)
            out = torch.cat([p_out, d_out])  # [num_tokens, num_heads, head_size]
        elif md.mode == ForwardMode.PREFILL:
            out = _prefill(q, k, v, kv_cache, md, layer.scale, window, cap, scales)
        else:
            out = _decode(q, kv_cache, md, layer.scale, window, cap, scales)
        return out.reshape(-1, h * d)  # [num_tokens, num_heads * head_size]


def _prefill(
    q, k, v, kv_cache, md: TorchSDPAMetadata, scale: float, window=None, soft_cap=None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:  # fmt: skip
    """A prefill's attention (its keys already written): causal among each row's new
    tokens, or over the cached context too when some row has one (read back at
    ``kv_scales``, as :func:`_decode`); ``window`` and ``soft_cap`` as
    :func:`causal_prefill`. Shapes as :func:`causal_prefill`."""
    if md.context_lens is not None:
        return context_prefill(q, k, v, kv_cache, md, scale, window, soft_cap, kv_scales)
    return causal_prefill(q, k, v, md.query_start_loc, scale, window, soft_cap)


def causal_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: list[int],
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Causal attention per sequence over its own new tokens (one SDPA call per sequence;
    with one sequence it is CUDA-graph capturable, which graph prefills rely on).

    q: [num_tokens, num_heads, head_size]; k, v: [num_tokens, num_kv_heads, head_size];
    ``starts``: host token offsets of the sequences, num_seqs + 1 entries; ``window`` and
    ``soft_cap``: the layer's sliding window and score cap (see ``sdpa_ops``).
    Returns [num_tokens, num_heads, head_size].
    """
    out = torch.empty_like(q)
    for i in range(len(starts) - 1):
        s, e = starts[i], starts[i + 1]
        out[s:e] = causal_attend(q[s:e], k[s:e], v[s:e], scale, window, soft_cap)
    return out


def _decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    md: TorchSDPAMetadata,
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """One query token per row against the row's cached context (its own key included);
    with a ``window`` only the row's last ``window`` positions (see ``sdpa_ops``). The
    cached keys and values are read in q's dtype times ``kv_scales`` (k_scale, v_scale:
    ``kv_cache_dtype.from_cache``).

    q: [num_rows, num_heads, head_size]; returns the same shape.
    """
    bt = md.block_tables  # [num_rows, max_blocks]
    rows, max_blocks = bt.shape
    block_size, n_kv, d = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    span = max_blocks * block_size
    k = kv_cache[0][bt].view(rows, span, n_kv, d).transpose(1, 2)  # [rows, n_kv, span, d]
    v = kv_cache[1][bt].view(rows, span, n_kv, d).transpose(1, 2)  # [rows, n_kv, span, d]
    # an 8-bit cache's values in the model's dtype, times the layer's scales
    k, v = from_cache(k, q.dtype, kv_scales[0]), from_cache(v, q.dtype, kv_scales[1])
    pos = torch.arange(span, device=q.device)  # [span]
    # the query sits at position seq_len - 1: causal = every position below seq_len
    mask = window_mask((md.seq_lens - 1)[:, None], pos[None, :], window)  # [rows, 1, span]
    qi = q.unsqueeze(2)  # [rows, num_heads, 1, head_size]
    out = attend(qi, k, v, scale, mask=mask[:, None], soft_cap=soft_cap)
    return out.squeeze(2)  # [rows, num_heads, head_size]


class TorchSDPABackend(AttentionBackend):
    """The TORCH_SDPA backend (reference; default on CPU and for float32 on CUDA)."""

    name = "TORCH_SDPA"
    supports_prefill_graphs = True  # a graph prefill is its plain one-sequence prefill

    def loop_max_rows(self) -> int:
        """8: the graph state advances at every size (torch ops), and decode-loop graphs
        serve the small batches where the host dominates a step."""
        return 8

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    def build_metadata(self, step: StepInputs, scratch_slot: int) -> TorchSDPAMetadata:
        """Build device metadata; padded lanes (slot -1) get the scratch slot and a block
        table pointing at the scratch block with length 1, so they read nothing real."""
        device, block_size = self.spec.device, self.spec.block_size
        if step.mode == ForwardMode.MIXED:
            prefill, decode = step.split()
            return TorchSDPAMetadata(
                mode=step.mode,
                num_rows=len(step.seq_lens),
                num_tokens=len(step.slot_mapping),
                slot_mapping=to_device(_slots(step, scratch_slot), device),  # [num_tokens]
                scratch_slot=scratch_slot,
                max_seq_len=max(step.seq_lens),
                prefill_part=self.build_metadata(prefill, scratch_slot),
                decode_part=self.build_metadata(decode, scratch_slot),
            )
        slots = _slots(step, scratch_slot)  # [num_tokens]
        md = TorchSDPAMetadata(
            mode=step.mode,
            num_rows=len(step.seq_lens),
            num_tokens=len(step.slot_mapping),
            slot_mapping=to_device(slots, device),
            scratch_slot=scratch_slot,
            max_seq_len=max(step.seq_lens) if step.seq_lens else 0,
        )
        if step.mode == ForwardMode.PREFILL:
            starts = [0]
            for n in step.query_lens:
                starts.append(starts[-1] + n)
            md.query_start_loc = starts
            context = [n - q for n, q in zip(step.seq_lens, step.query_lens)]
            if any(context):  # prefix caching: these rows read cached context
                md.context_lens = context
                width = max(len(b) for b in step.block_tables)
                table, _ = decode_tables(step, width, scratch_slot // block_size)
                md.block_tables = to_device(table, device)  # [rows, width]
        else:
            width = max(1, max((len(b) for b in step.block_tables), default=1))
            if device.type == "cuda":
                # The graph width: eager and replayed decode then reduce over the same
                # masked span, so --enforce-eager and graphs give identical arithmetic.
                width = max(width, self.spec.max_blocks_per_seq)
            table, lens = decode_tables(step, width, scratch_slot // block_size)
            md.block_tables = to_device(table, device)  # [rows, width]
            md.seq_lens = to_device(lens, device)  # [rows]
        return md

    def make_graph_state(self, scratch_slot: int) -> TorchSDPAGraphState:
        return TorchSDPAGraphState(self.spec, scratch_slot)


def decode_tables(
    step: StepInputs, width: int, scratch_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host block tables [rows, width] int64 and lengths [rows] int64 of a decode step.

    Padded lanes (and table tails) point at the scratch block with length 1, so they read
    nothing real; tables wider than ``width`` are clipped (the graph gate guarantees the
    clipped part lies beyond the row's context).

    The tables are flattened once per call (``host_tables.step_tables``) and scattered
    into the scratch-filled array by one indexed assignment.
    """
    rows = len(step.seq_lens)
    table = np.full((rows, width), scratch_block, dtype=np.int64)  # [rows, width]
    ft = step_tables(step)  # flattened once per call (a multi-step call's steps share it)
    flat, tlen = ft.flat, ft.lens  # [table entries], [len(tables)]
    if len(flat):
        col = ft.cols  # [table entries]
        # position of each entry in the flattened table: its row's start plus its column
        dest = col + np.repeat(np.arange(len(tlen), dtype=np.int64) * width, tlen)
        if int(tlen.max()) > width:  # clip: keep the first `width` blocks of each row
            keep = col < width
            flat, dest = flat[keep], dest[keep]
        table.reshape(-1)[dest] = flat
    lens = np.fromiter(step.seq_lens, dtype=np.int64, count=rows)  # [rows]
    np.maximum(lens, 1, out=lens)
    return torch.from_numpy(table), torch.from_numpy(lens)


def _slots(step: StepInputs, scratch_slot: int) -> torch.Tensor:
    """[num_tokens] int64 host slot mapping with padded lanes (-1) sent to the scratch
    slot."""
    return torch.from_numpy(scratch_slots(step.slot_mapping, scratch_slot))  # [num_tokens]


class TorchSDPAGraphState(AttentionGraphState):
    """Per-VE graph buffers of TORCH_SDPA: slot mapping [max_bs], lengths [max_bs] and block
    tables [max_bs, ceil(max_seq_len_to_capture / block_size)], all int64; for prefill
    graphs a slot mapping [max prefill tokens] int64."""

    def allocate(self, max_bs: int) -> None:
        d = self.spec.device
        self.max_bs = max_bs
        self.slot_mapping = torch.full((max_bs,), self.scratch_slot, dtype=torch.long, device=d)
        self.seq_lens = torch.ones(max_bs, dtype=torch.long, device=d)
        shape = (max_bs, self.spec.max_blocks_per_seq)
        self.block_tables = torch.full(shape, self.scratch_block, dtype=torch.long, device=d)

    def metadata_for_capture(self, bs: int) -> TorchSDPAMetadata:
        if bs > self.max_bs:
            raise ValueError(f"capture size {bs} exceeds the allocated maximum {self.max_bs}.")
        return TorchSDPAMetadata(
            mode=ForwardMode.DECODE,
            num_rows=bs,
            num_tokens=bs,
            slot_mapping=self.slot_mapping[:bs],
            scratch_slot=self.scratch_slot,
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            max_seq_len=self.spec.max_seq_len_to_capture,
        )

    def allocate_prefill(self, max_tokens: int) -> None:
        d = self.spec.device
        self.prefill_slots = torch.full(
            (max_tokens,), self.scratch_slot, dtype=torch.long, device=d
        )  # [max_tokens]

    def prefill_metadata_for_capture(self, tokens: int) -> TorchSDPAMetadata:
        if tokens > self.prefill_slots.shape[0]:
            raise ValueError(
                f"prefill capture size {tokens} exceeds the allocated maximum "
                f"{self.prefill_slots.shape[0]}."
            )
        return TorchSDPAMetadata(
            mode=ForwardMode.PREFILL,
            num_rows=1,
            num_tokens=tokens,
            slot_mapping=self.prefill_slots[:tokens],
            scratch_slot=self.scratch_slot,
            query_start_loc=[0, tokens],
            max_seq_len=tokens,
        )

    def prepare_prefill_replay(
        self, tokens: int, step: StepInputs, metadata: AttentionMetadata
    ) -> None:
        metadata.slot_mapping.copy_(_slots(step, self.scratch_slot), non_blocking=True)

    def advances_on_device(self, metadata: AttentionMetadata) -> bool:
        return True

    def advance(self, metadata: AttentionMetadata, positions: torch.Tensor) -> None:
        md: TorchSDPAMetadata = metadata  # type: ignore[assignment]
        bs = self.spec.block_size
        real = md.slot_mapping != self.scratch_slot  # [rows] padded lanes stay as they are
        md.seq_lens.copy_(torch.where(real, positions + 1, md.seq_lens))  # [rows]
        blocks = md.block_tables.gather(1, (positions // bs)[:, None])[:, 0]  # [rows]
        md.slot_mapping.copy_(torch.where(real, blocks * bs + positions % bs, md.slot_mapping))

    def prepare_replay(self, bs: int, step: StepInputs, metadata: AttentionMetadata) -> None:
        md: TorchSDPAMetadata = metadata  # type: ignore[assignment]
        table, lens = decode_tables(step, self.spec.max_blocks_per_seq, self.scratch_block)
        md.slot_mapping.copy_(_slots(step, self.scratch_slot), non_blocking=True)
        md.seq_lens.copy_(lens, non_blocking=True)
        md.block_tables.copy_(table, non_blocking=True)


TorchSDPAMetadata.impl = TorchSDPAImpl
