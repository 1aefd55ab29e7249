"""Decode-loop graphs over FlashInfer's wrappers: one plan per multi-step call.

Why: a decode-loop graph (vllm/cudagraph/decode_loop.py) replays a whole step (forward,
logits, greedy sampling, feeding the ids back) ``n`` times with no host work between the
replays. FlashInfer's decode wrappers plan on the host, and their plan depends on the
context lengths, which grow by one token a step. Planning the call's *last* step once
makes every step of the call runnable from that plan:

- The plan decides how each row's context is split into KV chunks (whole pages) and where
  each chunk's partial result goes. The tensor-core decode kernel (FlashInfer's batch
  prefill kernel with one query a row) reads each row's actual length from the device
  page tables at run time, ``(indptr[r + 1] - indptr[r] - 1) * page_size +
  last_page_len[r]``, and clamps both ends of every chunk to it (flashinfer-python
  0.7.2.post1, the pinned version: ``BatchPrefillWithPagedKVCacheDevice`` takes
  ``min(start, kv_len)`` and ``min(end, kv_len)``): at an earlier step the row is up to
  ``n - 1`` tokens shorter, its last chunk shorter or empty, and the merge of the chunks
  gives that length's attention. FlashInfer's CUDA-core decode kernel does not clamp a
  chunk's start, so only tensor-core decode loops over the wrappers
  (``FlashInferBackend.loops_over_wrappers``).
- ``indptr`` and ``indices`` hold the pages of the last step (the scheduler reserved them
  as lookahead slots before the call); ``last_page_len`` starts at step 0's value, which
  is the last step's minus ``n - 1`` and may be zero or negative (a row that enters its
  last page later in the call): only the length formula above reads it, and that stays
  exact.
- After each step :func:`advance_paged` adds one token to every real row's
  ``last_page_len`` and derives the next token's slot (and its key / value rows in the
  flat cache view) from the page tables, with device ops that the graph captures.

A step of the loop and a per-step plan of the same lengths split the context alike
unless some row's page count changed within the call (the chunk size is chosen for the
whole batch from page counts); then the two can differ by rounding (docs/design.md, "One
FlashInfer plan per call").
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.attention.backends.abstract import StepInputs
from vllm.attention.backends.flashinfer.paged_cache import kv_rows_of
from vllm.attention.backends.host_tables import step_tables
from vllm.kernels.dispatch import get_triton_decode_step


def lengthened(step: StepInputs, extra: int, block_size: int) -> StepInputs:
    """``step`` with every real row ``extra`` tokens longer (padded lanes stay at length
    0): the last step of a call of ``extra + 1`` steps, for planning. Only its lengths and
    tables are meaningful (they are the same tables, flattened once and shared).

    Raises:
        IndexError: a real row's table does not cover its last step (the scheduler did not
            reserve the call's lookahead blocks), as the per-step path raises.
    """
    real = step.num_real_rows
    ft = step_tables(step)
    last = np.fromiter(step.seq_lens[:real], dtype=np.int64, count=real) + extra  # [real]
    r = ft.first_short(-(-last // block_size))  # blocks the last step needs, [real]
    if r >= 0:
        raise IndexError(
            f"row {r} reaches {int(last[r])} tokens in this call, but its table has "
            f"{int(ft.lens[r])} blocks of {block_size} (lookahead not reserved)."
        )
    seq_lens = [n + extra for n in step.seq_lens[:real]] + step.seq_lens[real:]
    out = StepInputs(step.mode, seq_lens, step.query_lens, step.block_tables,
                     step.slot_mapping, real)  # fmt: skip
    out.flat_tables = ft
    return out


def first_page_lens(last: torch.Tensor, real: int, extra: int) -> torch.Tensor:
    """[rows] int32 host: step 0's ``last_page_len`` from the last step's ``last``
    [rows] int32 (planned ``extra`` tokens later): ``extra`` less on the ``real`` rows."""
    first = last.clone()
    first[:real] -= extra
    return first


def advance_paged(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    slot_rows: torch.Tensor,
    positions: torch.Tensor,
    scratch_slot: int,
    block_size: int,
) -> None:
    """One token later on every real row of a loop-planned decode batch, in place and
    with device ops only (captured inside a decode-loop graph): on CUDA one launch of
    :func:`vllm.kernels.decode_step.advance_paged`, else the torch ops below.

    Args:
        indptr: [rows + 1] int32 page offsets of the call's last step.
        indices: [capacity] int32 pages (row r's are ``indices[indptr[r]:indptr[r + 1]]``).
        last_page_len: [rows] int32, the current step's (see the module docstring).
        slot_rows: [3, rows] int64 slot, key row and value row of each row's new token
            in the flat cache view (``paged_cache.slot_rows_host``); padded lanes hold
            ``scratch_slot`` and keep it.
        positions: [rows] int64, the next tokens' positions (already advanced).
        scratch_slot: this VE's scratch slot; block_size: tokens per page.
    """
    kernels = get_triton_decode_step(positions)
    if kernels is not None:  # the same in one launch on CUDA
        kernels.advance_paged(indptr, indices, last_page_len, slot_rows, positions,
                              scratch_slot, block_size)  # fmt: skip
        return
    live = slot_rows[0] != scratch_slot  # [rows] bool: real rows
    last_page_len.add_(live.to(last_page_len.dtype))
    pos = torch.where(live, positions, 0)  # [rows] int64, padded lanes at 0
    # [rows] entry of the new token's page; kept inside the row, since the advance after a
    # call's last step runs one token past the pages it planned (its slots go unused)
    at = torch.minimum(indptr[:-1].long() + pos // block_size, indptr[1:].long() - 1)
    page = indices[at].long()  # [rows]
    slot = torch.where(live, page * block_size + pos % block_size, scratch_slot)  # [rows]
    key_row, value_row = kv_rows_of(slot, block_size)  # [rows] each
    slot_rows[0].copy_(slot)
    slot_rows[1].copy_(key_row)
    slot_rows[2].copy_(value_row)
