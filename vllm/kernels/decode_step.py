"""The bookkeeping between two replays of a decode-loop graph, one launch each.

Why: after its forward pass and sampling, a decode-loop step (vllm/cudagraph/decode_loop.py)
stores its samples, feeds the sampled ids back, moves the positions on and, with
FLASHINFER's wrappers planned once per call, advances every row's page length and
next-token slot (``loop_plan.advance_paged``). As torch ops that is about 28 element-wise
kernels on a few hundred integers, each a launch of its own inside the graph, so a step
pays for a chain of near-empty kernels. Each function here does the same in one launch of
one program, bit for bit the same values (integer arithmetic and copies only):

- :func:`finish_step`: ``ring[counter] = packed``, ``counter += 1``, ``ids = next_ids``,
  ``positions += 1``;
- :func:`advance_paged`: ``loop_plan.advance_paged`` (its docstring has the formulas).

One program holds every row (a decode batch has at most a few hundred), so the reads of
the counter and of the old slots come before the writes in program order and no other
program can see a half-written state.

This module imports ``triton`` at the top: reach it through
:func:`vllm.kernels.dispatch.get_triton_decode_step` (CUDA only; CPU tests run it under
``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

MAX_ROWS = 4096  # the most rows of one launch (one program holds them all)


@triton.jit
def _finish_step_kernel(
    ring_ptr, counter_ptr, packed_ptr, ids_ptr, next_ptr, pos_ptr,
    rows, width, packed_stride, BLOCK: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """One program: ring[counter] = packed ([rows, width]), counter += 1, ids = next,
    positions += 1."""
    r = tl.arange(0, BLOCK)  # [BLOCK] rows
    r_ok = r < rows
    c = tl.arange(0, BLOCK_W)  # [BLOCK_W] packed columns
    m2 = r_ok[:, None] & (c < width)[None, :]  # [BLOCK, BLOCK_W]
    counter = tl.load(counter_ptr)
    vals = tl.load(packed_ptr + r[:, None] * packed_stride + c[None, :], mask=m2)
    dst = ring_ptr + (counter * rows + r[:, None]) * width + c[None, :]  # [BLOCK, BLOCK_W]
    tl.store(dst, vals, mask=m2)
    tl.store(ids_ptr + r, tl.load(next_ptr + r, mask=r_ok), mask=r_ok)
    tl.store(pos_ptr + r, tl.load(pos_ptr + r, mask=r_ok) + 1, mask=r_ok)
    tl.store(counter_ptr, counter + 1)


def finish_step(
    ring: torch.Tensor,
    counter: torch.Tensor,
    packed: torch.Tensor,
    ids: torch.Tensor,
    next_ids: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """The end of a decode-loop step, in place: ``ring[counter] = packed``,
    ``counter += 1``, ``ids.copy_(next_ids)``, ``positions += 1``.

    Args:
        ring: [steps, rows, W] contiguous, the call's sample rows; packed: [rows, W] of
            its dtype, unit column stride.
        counter: [1] int64, the ring row to write (the caller keeps it below ``steps``).
        ids, next_ids: [rows] of one integer dtype, contiguous (input ids, sampled ids).
        positions: [rows] integer, contiguous.
    Raises:
        ValueError: shapes, dtypes or strides other than the above, or more than MAX_ROWS
            rows.
    """
    _, rows, width = ring.shape
    if (
        packed.shape != (rows, width) or packed.dtype != ring.dtype or packed.stride(1) != 1
        or not ring.is_contiguous() or counter.shape != (1,) or counter.dtype != torch.int64
        or ids.shape != (rows,) or next_ids.shape != (rows,) or ids.dtype != next_ids.dtype
        or positions.shape != (rows,) or not ids.is_contiguous()
        or not next_ids.is_contiguous() or not positions.is_contiguous()
    ):  # fmt: skip
        raise ValueError(
            f"finish_step: ring {tuple(ring.shape)} {ring.dtype}, packed "
            f"{tuple(packed.shape)} {packed.dtype} strides {packed.stride()}, counter "
            f"{tuple(counter.shape)} {counter.dtype}, ids {tuple(ids.shape)} {ids.dtype}, "
            f"next {tuple(next_ids.shape)} {next_ids.dtype}, positions "
            f"{tuple(positions.shape)}: expected [steps, rows, W] contiguous, [rows, W], "
            "[1] int64 and [rows] contiguous"
        )
    if rows > MAX_ROWS:
        raise ValueError(f"{rows} rows > MAX_ROWS={MAX_ROWS}")
    _finish_step_kernel[(1,)](
        ring, counter, packed, ids, next_ids, positions, rows, width, packed.stride(0),
        BLOCK=triton.next_power_of_2(max(rows, 1)), BLOCK_W=triton.next_power_of_2(width),
        num_warps=4,
    )  # fmt: skip


@triton.jit
def _advance_paged_kernel(
    indptr_ptr, indices_ptr, last_ptr, slot_ptr, pos_ptr, rows, slot_stride, scratch_slot,
    BS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program: ``loop_plan.advance_paged`` for rows [0, rows)."""
    r = tl.arange(0, BLOCK)  # [BLOCK] rows
    r_ok = r < rows
    old = tl.load(slot_ptr + r, mask=r_ok, other=scratch_slot)  # [BLOCK] int64
    live = r_ok & (old != scratch_slot)  # real rows
    last = tl.load(last_ptr + r, mask=r_ok, other=0)
    tl.store(last_ptr + r, last + live.to(last.dtype), mask=r_ok)
    pos = tl.where(live, tl.load(pos_ptr + r, mask=r_ok, other=0).to(tl.int64), 0)
    lo = tl.load(indptr_ptr + r, mask=r_ok, other=0).to(tl.int64)
    hi = tl.load(indptr_ptr + r + 1, mask=r_ok, other=1).to(tl.int64)
    at = tl.minimum(lo + pos // BS, hi - 1)  # the new token's page entry, inside the row
    page = tl.load(indices_ptr + at, mask=live, other=0).to(tl.int64)
    slot = tl.where(live, page * BS + pos % BS, scratch_slot)  # [BLOCK] int64
    key_row = slot + (slot // BS) * BS  # paged_cache.kv_rows_of
    tl.store(slot_ptr + r, slot, mask=r_ok)
    tl.store(slot_ptr + slot_stride + r, key_row, mask=r_ok)
    tl.store(slot_ptr + 2 * slot_stride + r, key_row + BS, mask=r_ok)


def advance_paged(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    slot_rows: torch.Tensor,
    positions: torch.Tensor,
    scratch_slot: int,
    block_size: int,
) -> None:
    """``loop_plan.advance_paged`` (same arguments, same results) in one launch.

    Args:
        indptr: [rows + 1] int32; indices: [capacity] int32; last_page_len: [rows] int32
            (contiguous, updated in place).
        slot_rows: [3, rows] int64 with unit column stride (updated in place).
        positions: [rows] integer, contiguous, the next tokens' positions.
        scratch_slot, block_size: as there.
    Raises:
        ValueError: shapes or strides other than the above, or more than MAX_ROWS rows.
    """
    rows = last_page_len.shape[0]
    if (
        indptr.shape != (rows + 1,) or slot_rows.shape != (3, rows)
        or slot_rows.dtype != torch.int64 or slot_rows.stride(1) != 1
        or positions.shape != (rows,) or not positions.is_contiguous()
        or not last_page_len.is_contiguous() or not indptr.is_contiguous()
    ):  # fmt: skip
        raise ValueError(
            f"advance_paged: indptr {tuple(indptr.shape)}, last_page_len "
            f"{tuple(last_page_len.shape)}, slot_rows {tuple(slot_rows.shape)} "
            f"{slot_rows.dtype} strides {slot_rows.stride()}, positions "
            f"{tuple(positions.shape)}: expected [rows + 1], [rows], [3, rows] int64 with "
            "unit column stride and [rows], contiguous"
        )
    if rows > MAX_ROWS:
        raise ValueError(f"{rows} rows > MAX_ROWS={MAX_ROWS}")
    if rows == 0:
        return
    _advance_paged_kernel[(1,)](
        indptr, indices, last_page_len, slot_rows, positions, rows, slot_rows.stride(0),
        scratch_slot, BS=block_size, BLOCK=triton.next_power_of_2(rows), num_warps=4,
    )  # fmt: skip
