"""FLASHINFER's once-per-call plan of decode-loop graphs (flashinfer/loop_plan.py) on the
host: the page tables planned for the call's last step, step 0's ``last_page_len``, and
``advance_paged`` against the per-step host path (multi_step._next_step + paged_kv_host +
slot_rows_host) step by step. Runs on CPU tensors; the GPU test of the kernels is
test_cuda_graphs_gpu.py::test_flashinfer_loop_plan_each_step."""

import numpy as np
import pytest
import torch

from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.backends.flashinfer import FlashInferBackend
from vllm.attention.backends.flashinfer.loop_plan import (
    advance_paged,
    first_page_lens,
    lengthened,
)
from vllm.attention.backends.flashinfer.paged_cache import paged_kv_host, slot_rows_host
from vllm.worker.multi_step import _next_step

BS = 16
SCRATCH_BLOCK = 60
SCRATCH = SCRATCH_BLOCK * BS


def _first_step(lens: list[int], steps: int, pad: int) -> StepInputs:
    """Real rows of ``lens`` tokens whose tables cover ``steps - 1`` lookahead tokens
    (rows' blocks interleaved, not contiguous), then ``pad`` padded lanes."""
    tables = [[3 * j + r for j in range(-(-(n + steps - 1) // BS))] for r, n in enumerate(lens)]
    slots = [t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens)]
    return StepInputs(ForwardMode.DECODE, lens + [0] * pad, [1] * (len(lens) + pad),
                      tables + [[] for _ in range(pad)], slots + [-1] * pad,
                      len(lens))  # fmt: skip


@pytest.mark.parametrize("steps", [2, 8, 17])
def test_advance_matches_the_per_step_host_path(steps):
    lens = [1, 14, 16, 17, 30, 100]  # enter a new page at once, later in the call, or not
    step = _first_step(lens, steps, pad=2)
    indptr, indices, last = paged_kv_host(lengthened(step, steps - 1, BS), BS, SCRATCH_BLOCK)
    last = first_page_lens(last, step.num_real_rows, steps - 1)
    slot_rows = slot_rows_host(step.slot_mapping, SCRATCH, BS)  # [3, rows]
    pos = torch.tensor([n - 1 for n in lens] + [0, 0])
    assert min(last[: len(lens)].tolist()) <= 0  # step 0's value can be zero or negative
    ref = step
    for i in range(steps):
        pages = (indptr[1:] - indptr[:-1]).long()  # [rows]
        got_lens = (pages - 1) * BS + last.long()  # FlashInfer's length formula
        assert got_lens[: len(lens)].tolist() == [n + i for n in lens], i
        assert got_lens[len(lens) :].tolist() == [1, 1]  # padded lanes: one scratch token
        want_rows = slot_rows_host(ref.slot_mapping, SCRATCH, BS)
        assert torch.equal(slot_rows, want_rows), i
        # every real row's pages are its table's first ones, so the slots read the table
        for r in range(len(lens)):
            start, n = int(indptr[r]), int(pages[r])
            assert indices[start : start + n].tolist() == ref.block_tables[r][:n], (i, r)
        if i + 1 < steps:
            ref, _ = _next_step(ref, BS)
            pos += 1
            advance_paged(indptr, indices, last, slot_rows, pos, SCRATCH, BS)


def test_first_page_lens_only_real_rows():
    last = torch.tensor([3, 1, 16, 1, 1], dtype=torch.int32)
    first = first_page_lens(last, 3, 7)
    assert first.tolist() == [-4, -6, 9, 1, 1] and last.tolist() == [3, 1, 16, 1, 1]


def test_lengthened_keeps_padded_lanes_and_shares_tables():
    step = _first_step([5, 20], 4, pad=1)
    longer = lengthened(step, 3, BS)
    assert longer.seq_lens == [8, 23, 0] and longer.num_real_rows == 2
    assert longer.flat_tables is step.flat_tables is not None
    assert np.array_equal(longer.flat_tables.flat, [0, 1, 4])


def _backend(heads: int, kv_heads: int, windows=()) -> FlashInferBackend:
    spec = AttentionSpec(heads, kv_heads, 16, BS, torch.float32, torch.device("cpu"), 256, 0,
                         sliding_windows=windows)  # fmt: skip
    return FlashInferBackend(spec, object, object, prebuild=False)


def test_loops_over_wrappers_only_with_tensor_cores_and_no_window():
    assert _backend(9, 3).loops_over_wrappers  # group 3: tensor-core decode
    assert _backend(9, 3).loop_max_rows() >= 512
    assert not _backend(4, 2).loops_over_wrappers  # group 2: CUDA-core decode
    assert _backend(4, 2).loop_max_rows() == 0  # its small-decode limit (off here)
    assert not _backend(9, 3, windows=(64,)).loops_over_wrappers


def test_a_table_short_of_the_last_step_raises():
    step = _first_step([14, 20], 2, pad=0)  # tables cover one lookahead token only
    lengthened(step, 1, BS)
    with pytest.raises(IndexError, match=r"row 0 reaches 17 tokens .* 1 blocks .*lookahead"):
        lengthened(step, 3, BS)


def test_the_advance_after_a_calls_last_step_stays_in_its_row():
    """The graph advances once more after the call's last step, one token past the pages
    planned: with the page buffer exactly full, the page lookup must stay inside the row
    (an index past the buffer would fault on the device; on the CPU it raises)."""
    step = _first_step([15, 31], 2, pad=0)  # last steps at 16 and 32 tokens: full pages
    indptr, indices, last = paged_kv_host(lengthened(step, 1, BS), BS, SCRATCH_BLOCK)
    indices = indices.clone()  # [pages], no spare capacity after the last row
    slot_rows = slot_rows_host(step.slot_mapping, SCRATCH, BS)
    pos = torch.tensor([16, 32])  # the token after the last step: past both rows' pages
    advance_paged(indptr, indices, first_page_lens(last, 2, 1), slot_rows, pos, SCRATCH, BS)
    assert slot_rows.shape == (3, 2)
