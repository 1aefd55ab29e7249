"""FLASHINFER's paged-cache helpers, shared by its eager, graph and prefill paths.

Cache layout per layer: [num_blocks + 1, 2, block_size, num_kv_heads, head_size] ("NHD",
key at index 0 of dim 1); block ``num_blocks`` is the scratch block. Here: a step's page
tables in FlashInfer's form (:func:`paged_kv_host`), each new token's slot and its key /
value rows in the flat cache view (:func:`slot_rows_host`), the cache write
(:func:`write_kv`, :func:`rotate_and_write`), and how a wrapper is planned over the page
tables (:func:`plan_paged`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vllm.attention.backends.abstract import StepInputs
from vllm.attention.backends.host_tables import exclusive_cumsum, scratch_slots, step_tables
from vllm.attention.kv_cache_dtype import layer_kv_scales, store_rows


def kv_rows_of(
    slot: np.ndarray | torch.Tensor, block_size: int
) -> tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]:
    """(key rows, value rows) of int64 slots ``slot`` [n] (a numpy array or a torch tensor;
    the result is of the same kind) in the flat cache view.

    Layout [num_blocks + 1, 2, block_size, ...]: block b holds its keys at flat rows
    ``2*b*block_size + [0, block_size)`` and its values right after, so slot
    ``s = b*block_size + o`` has key row ``2*b*block_size + o = s + b*block_size`` and
    value row ``key row + block_size``.
    """
    key_row = slot + (slot // block_size) * block_size  # [n]
    return key_row, key_row + block_size


def slot_rows_host(slots: list[int], scratch_slot: int, block_size: int) -> torch.Tensor:
    """[3, num_tokens] int64 host tensor: the slot mapping with padded lanes (-1) sent to
    ``scratch_slot``, then each slot's key row and value row (:func:`kv_rows_of`)."""
    rows = np.empty((3, len(slots)), dtype=np.int64)  # [3, num_tokens]
    rows[0] = scratch_slots(slots, scratch_slot)
    rows[1], rows[2] = kv_rows_of(rows[0], block_size)
    return torch.from_numpy(rows)


def write_kv(
    kv_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_rows: torch.Tensor,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    """Scatter keys/values into the NHD paged cache (two index copies, no index math),
    divided by ``kv_scales`` (k_scale, v_scale) and rounded to the cache's dtype when it
    is an 8-bit one (``kv_cache_dtype.store_rows``).

    kv_cache: [num_blocks + 1, 2, block_size, num_kv_heads, head_size];
    key, value: [num_tokens, num_kv_heads, head_size]; kv_rows: [2, num_tokens] int64 rows
    of the flat view (padded lanes already redirected to the scratch slot).
    """
    flat = kv_cache.view(-1, kv_cache.shape[-2], kv_cache.shape[-1])  # [rows, kv_heads, D]
    store_rows(flat, kv_rows[0], key, kv_scales[0])
    store_rows(flat, kv_rows[1], value, kv_scales[1])


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
    cache at ``kv_rows`` [2, num_tokens] (see :func:`write_kv`): on CUDA, with a cache in
    the model's dtype, one fused kernel does both; otherwise the rotation, then
    :func:`write_kv` (an 8-bit cache at the layer's ``kv_cache_dtype.layer_kv_scales``).

    query: [num_tokens, num_heads * head_size]; key, value: [num_tokens, num_kv_heads *
    head_size]. Returns (query, key) rotated, same shapes (the cached key is the rotated one).
    """
    h_kv, d = layer.num_kv_heads, layer.head_size
    written = False
    if rotary_emb is not None and kv_cache.dtype != key.dtype:
        query, key = rotary_emb(positions, query, key)
    elif rotary_emb is not None:  # on CUDA one kernel rotates and writes the cache rows
        flat = kv_cache.view(-1, h_kv * d)  # [(num_blocks + 1) * 2 * block_size, ...]
        query, key, written = rotary_emb.forward_and_cache(
            positions, query, key, value, flat, kv_rows
        )
    if not written:
        write_kv(kv_cache, key.view(-1, h_kv, d), value.view(-1, h_kv, d), kv_rows,
                 layer_kv_scales(layer, kv_cache.dtype))  # fmt: skip
    return query, key


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

    Whole-array work: the tables are flattened once per step, or once per multi-step call
    (``host_tables.step_tables``), each row's page count and tail are computed for all rows
    at once, and the pages are one gather of the rows' table prefixes, with scratch pages
    where a row has no table.
    """
    rows = min(len(step.seq_lens), len(step.block_tables))  # zip() of the two lists
    seq = np.fromiter(step.seq_lens, dtype=np.int64, count=rows)  # [rows]
    ft = step_tables(step)  # flattened once per call (a multi-step call's steps share it)
    flat, tlen = ft.head(rows)  # [table entries] int64, [rows] int64
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
    total = int(indptr[-1])
    all_on_table = bool(from_table.all())
    # take <= tlen, so equal totals with every row on its table mean whole tables
    if total == len(flat) and all_on_table:
        indices = flat  # every row uses its whole table: nothing to select
    else:
        # page j of row i (j < take) is table entry starts[i] + j: one gather of every
        # row's table prefix; rows without a table read the scratch block
        shift = np.repeat(ft.starts[:rows] - indptr[:-1], count)  # [pages]
        src = np.arange(total, dtype=np.int64) + shift  # [pages] entries of flat
        if all_on_table:
            indices = flat[src]
        else:
            on_table = np.repeat(from_table, count)  # [pages]
            indices = np.full(total, scratch_block, dtype=np.int64)  # [pages]
            indices[on_table] = flat[src[on_table]]
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


def plan_paged(
    wrapper: Any,
    kwargs: dict[str, Any],
    head_size: int,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    qo_indptr: torch.Tensor | None = None,
) -> None:
    """Plan a FlashInfer wrapper over page tables (:func:`paged_kv_host`'s form): a causal
    prefill wrapper when ``qo_indptr`` [rows + 1] int32 (each row's query tokens) is given,
    else a decode wrapper (one query token a row). ``kwargs`` is the backend's
    ``plan_kwargs(window)``; with ``head_size`` it selects FlashInfer's module, so every
    planning path (eager steps, graph replays, the background builds) goes through here."""
    if qo_indptr is not None:
        wrapper.plan(qo_indptr, indptr, indices, last_page_len, head_dim_qk=head_size,
                     causal=True, **kwargs)  # fmt: skip
    else:
        wrapper.plan(indptr, indices, last_page_len, head_dim=head_size, **kwargs)
