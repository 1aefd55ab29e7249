"""The array-based host metadata builders equal the per-row list loops they replaced.

Guards a silent change of attention metadata when the builders were vectorized: FLASHINFER's
``paged_kv_host`` (indptr / indices / last_page_len) and ``slot_rows_host`` (slot, key row,
value row), TORCH_SDPA's ``decode_tables`` (block table and lengths) and ``_slots``. The
references are the loops the builders ran before, written out element by element (kept
once, in benchmarks/profile_host_metadata.py); every case must match them exactly, dtype
included (int32 for FlashInfer's plan tensors, int64 for slots, rows and SDPA tables). The
graph states' ``prepare_replay`` is checked through the buffers it fills.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import sys

import pytest
import torch

from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.backends.flashinfer import FlashInferBackend
from vllm.attention.backends.flashinfer.paged_cache import paged_kv_host, slot_rows_host
from vllm.attention.backends.torch_sdpa import TorchSDPABackend, _slots, decode_tables

# ---- references: plain element-by-element loops, kept once, in
# benchmarks/profile_host_metadata.py (its "before" timings) --------------------------------


def _reference_module():
    bench = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("profile_host_metadata")


_REF = _reference_module()
ref_paged_kv = _REF.old_paged_kv_host
ref_slot_rows = _REF.old_slot_rows_host
ref_decode_tables = _REF.old_decode_tables
ref_slots = _REF.old_slots


# ---- random steps -----------------------------------------------------------------------


def _table(rng, need, num_blocks):
    """A table of ``need`` distinct real blocks, sometimes with extra (lookahead) blocks."""
    extra = rng.choice([0, 0, 0, 1, 3])
    return rng.sample(range(num_blocks), min(num_blocks, need + extra))


def random_step(rng, mode, block_size, num_blocks, max_len=300):
    """A step mixing real rows (lengths incl. exact block multiples), padded lanes (length
    0, empty table; rarely a table, which must be ignored) and, rarely, profiling rows
    (length > 0, empty table)."""
    rows = rng.randint(0, 12)
    seq_lens, query_lens, tables, slots = [], [], [], []
    real = 0
    for _ in range(rows):
        kind = rng.random()
        if kind < 0.2:  # padded lane; rarely one that still carries a table
            seq_lens.append(0)
            query_lens.append(1)
            tables.append(_table(rng, 2, num_blocks) if kind < 0.03 else [])
            slots.append(-1)
            continue
        if kind < 0.35:
            n = block_size * rng.randint(1, max(1, max_len // block_size))  # exact multiple
        else:
            n = rng.randint(1, max_len)
        need = -(-n // block_size)
        table = [] if kind > 0.92 else _table(rng, need, num_blocks)  # profiling: no table
        seq_lens.append(n)
        tables.append(table)
        real += 1
        if mode == ForwardMode.PREFILL:
            query_lens.append(n)
            for p in range(n):
                slots.append(table[p // block_size] * block_size + p % block_size if table else 0)
        else:
            query_lens.append(1)
            p = n - 1
            slots.append(table[p // block_size] * block_size + p % block_size if table else -1)
    return StepInputs(mode, seq_lens, query_lens, tables, slots, real)


def _assert_same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got, want), (got, want)


SEEDS = range(80)
NUM_BLOCKS = 400  # real blocks; block NUM_BLOCKS is the scratch block
MODES = [ForwardMode.PREFILL, ForwardMode.DECODE]


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("mode", MODES)
def test_paged_kv_host_matches_reference(block_size, mode):
    rng = random.Random(block_size)
    for _ in SEEDS:
        step = random_step(rng, mode, block_size, NUM_BLOCKS)
        for width in (None, 0, 1, 2, 5, 1000):
            got = paged_kv_host(step, block_size, NUM_BLOCKS, width)
            want = ref_paged_kv(step, block_size, NUM_BLOCKS, width)
            for g, w in zip(got, want):
                _assert_same(g, w)
                assert g.is_pinned() == torch.cuda.is_available()


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("mode", MODES)
def test_slot_rows_and_slots_match_reference(block_size, mode):
    rng = random.Random(100 + block_size)
    scratch_slot = NUM_BLOCKS * block_size
    for _ in SEEDS:
        step = random_step(rng, mode, block_size, NUM_BLOCKS)
        _assert_same(
            slot_rows_host(step.slot_mapping, scratch_slot, block_size),
            ref_slot_rows(step.slot_mapping, scratch_slot, block_size),
        )
        _assert_same(_slots(step, scratch_slot), ref_slots(step, scratch_slot))


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_tables_matches_reference(block_size):
    rng = random.Random(200 + block_size)
    for _ in SEEDS:
        step = random_step(rng, ForwardMode.DECODE, block_size, NUM_BLOCKS)
        longest = max((len(t) for t in step.block_tables), default=0)
        for width in sorted({1, 2, max(1, longest - 1), max(1, longest), longest + 4}):
            got = decode_tables(step, width, NUM_BLOCKS)
            want = ref_decode_tables(step, width, NUM_BLOCKS)
            for g, w in zip(got, want):
                _assert_same(g, w)


def _lookahead_decode_step(rng, block_size, lookahead):
    """A decode step of real rows whose tables already hold ``lookahead`` more tokens (the
    blocks a multi-step call reserves), plus padded lanes after them."""
    rows = rng.randint(1, 10)
    seq_lens, tables, slots = [], [], []
    for _ in range(rows):
        n = rng.randint(1, 120)
        tables.append(rng.sample(range(NUM_BLOCKS), -(-(n + lookahead) // block_size)))
        seq_lens.append(n)
        p = n - 1
        slots.append(tables[-1][p // block_size] * block_size + p % block_size)
    pad = rng.randint(0, 3)
    return StepInputs(ForwardMode.DECODE, seq_lens + [0] * pad, [1] * (rows + pad),
                      tables + [[] for _ in range(pad)], slots + [-1] * pad, rows)  # fmt: skip


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_later_steps_of_a_call_reuse_the_flattened_tables(block_size):
    """The steps of a multi-step call hand their flattened tables on (``_next_step``); every
    builder's output for such a step equals the reference on a fresh step of the same lists
    (no cache), and a dataclasses.replace copy never inherits the cache."""
    from vllm.attention.backends.flashinfer.small_decode import small_decode_host
    from vllm.worker.multi_step import _next_step

    rng = random.Random(300 + block_size)
    for _ in range(40):
        lookahead = rng.randint(1, 7)
        step = _lookahead_decode_step(rng, block_size, lookahead)
        for i in range(lookahead + 1):
            fresh = StepInputs(step.mode, list(step.seq_lens), list(step.query_lens),
                               [list(t) for t in step.block_tables], list(step.slot_mapping),
                               step.num_real_rows)  # fmt: skip
            for width in (None, 3):
                for g, w in zip(paged_kv_host(step, block_size, NUM_BLOCKS, width),
                                ref_paged_kv(fresh, block_size, NUM_BLOCKS, width)):  # fmt: skip
                    _assert_same(g, w)
            for g, w in zip(decode_tables(step, 40, NUM_BLOCKS),
                            ref_decode_tables(fresh, 40, NUM_BLOCKS)):  # fmt: skip
                _assert_same(g, w)
            assert small_decode_host(step, NUM_BLOCKS).tolist() == (
                small_decode_host(fresh, NUM_BLOCKS).tolist()
            )
            assert step.flat_tables is not None
            assert dataclasses.replace(step, block_tables=[[]]).flat_tables is None
            if i == lookahead:
                break  # the table holds no further token
            nxt, positions = _next_step(step, block_size)
            assert nxt.flat_tables is step.flat_tables  # flattened once per call
            real = step.num_real_rows
            assert positions == step.seq_lens[:real] + [0] * (len(step.seq_lens) - real)
            assert nxt.seq_lens == [n + 1 for n in step.seq_lens[:real]] + positions[real:]
            want_slots = [t[p // block_size] * block_size + p % block_size
                          for t, p in zip(step.block_tables, positions[:real])]  # fmt: skip
            assert nxt.slot_mapping == want_slots + [-1] * (len(step.seq_lens) - real)
            step = nxt


def test_next_step_refuses_a_table_without_the_lookahead_block():
    """A row whose table ends before the new token's block is an error naming the row, not
    a slot read from the next row's table."""
    from vllm.worker.multi_step import _next_step

    step = StepInputs(ForwardMode.DECODE, [3, 8], [1, 1], [[7], [3, 5]], [30, 23], 2)
    with pytest.raises(IndexError, match="row 1 needs block 2 .* 2 blocks"):
        _next_step(step, 4)
    nxt, positions = _next_step(StepInputs(ForwardMode.DECODE, [3, 7], [1, 1], [[7], [3, 5]],
                                           [30, 22], 2), 4)  # fmt: skip
    assert positions == [3, 7] and nxt.slot_mapping == [31, 23] and nxt.seq_lens == [4, 8]


def test_edge_cases():
    """Empty step, all padded lanes, one row of an exact block multiple, a clipped row whose
    last_page_len exceeds the block size, profiling rows with no table, a padded lane with a
    table, a table shorter than the row needs, and fewer or more tables than rows
    (FlashInfer's builder pairs them as zip() does)."""
    bs, scratch = 4, 99
    steps = [
        StepInputs(ForwardMode.DECODE, [], [], [], [], 0),
        StepInputs(ForwardMode.DECODE, [0, 0, 0], [1] * 3, [[], [], []], [-1] * 3, 0),
        StepInputs(ForwardMode.DECODE, [8], [1], [[3, 7]], [31], 1),
        StepInputs(ForwardMode.DECODE, [9, 0], [1, 1], [[3, 7, 2], []], [8, -1], 1),
        StepInputs(ForwardMode.PREFILL, [6, 3], [6, 3], [[], []], [0] * 9, 2),
        StepInputs(ForwardMode.DECODE, [9, 3], [1, 1], [[3], [4]], [12, 17], 2),  # short
        StepInputs(ForwardMode.DECODE, [0, 6], [1, 1], [[4, 5], [6, 7]], [-1, 29], 1),
        StepInputs(ForwardMode.DECODE, [5, 2], [1, 1], [[1, 2]], [5, 9], 1),  # fewer tables
        StepInputs(ForwardMode.DECODE, [5], [1], [[1, 2], [3]], [5], 1),  # more tables
    ]
    for step in steps:
        for width in (None, 1, 2, 8):
            for g, w in zip(
                paged_kv_host(step, bs, scratch, width), ref_paged_kv(step, bs, scratch, width)
            ):
                _assert_same(g, w)
        _assert_same(
            slot_rows_host(step.slot_mapping, scratch * bs, bs),
            ref_slot_rows(step.slot_mapping, scratch * bs, bs),
        )
        _assert_same(_slots(step, scratch * bs), ref_slots(step, scratch * bs))
        if len(step.block_tables) == len(step.seq_lens):
            for width in (1, 2, 8):
                for g, w in zip(
                    decode_tables(step, width, scratch), ref_decode_tables(step, width, scratch)
                ):
                    _assert_same(g, w)
    clipped = paged_kv_host(steps[3], bs, scratch, 2)
    assert clipped[2].tolist() == [9 - 4, 1]  # 2 pages of a 3-page row: 5 > block size


def _spec(block_size=4, max_len=64):
    return AttentionSpec(
        num_heads=4,
        num_kv_heads=2,
        head_size=8,
        block_size=block_size,
        dtype=torch.float16,
        device=torch.device("cpu"),
        max_seq_len_to_capture=max_len,
    )


def test_prepare_replay_fills_buffers_like_reference():
    """Both graph states' prepare_replay: the buffers hold the reference values."""
    rng = random.Random(5)
    spec = _spec()
    num_blocks = 50
    scratch_slot = num_blocks * spec.block_size
    bs = 8
    step = random_step(rng, ForwardMode.DECODE, spec.block_size, num_blocks, max_len=60)
    while len(step.seq_lens) > bs or any(
        n > 0 and not t for n, t in zip(step.seq_lens, step.block_tables)
    ):
        step = random_step(rng, ForwardMode.DECODE, spec.block_size, num_blocks, max_len=60)
    pad = bs - len(step.seq_lens)
    step = StepInputs(
        ForwardMode.DECODE,
        step.seq_lens + [0] * pad,
        step.query_lens + [1] * pad,
        step.block_tables + [[] for _ in range(pad)],
        step.slot_mapping + [-1] * pad,
        step.num_real_rows,
    )

    sdpa = TorchSDPABackend(spec).make_graph_state(scratch_slot)
    sdpa.allocate(bs)
    md = sdpa.metadata_for_capture(bs)
    sdpa.prepare_replay(bs, step, md)
    table, lens = ref_decode_tables(step, spec.max_blocks_per_seq, num_blocks)
    _assert_same(md.block_tables, table)
    _assert_same(md.seq_lens, lens)
    _assert_same(md.slot_mapping, ref_slots(step, scratch_slot))

    # the FlashInfer wrapper path (the small path has its own test)
    fi_spec = dataclasses.replace(spec, small_decode_max_rows=0)
    fi = FlashInferBackend(fi_spec, FakePrefillWrapper, FakeDecodeWrapper)
    state = fi.make_graph_state(scratch_slot)
    state.allocate(bs)
    md = state.metadata_for_capture(bs)
    state.prepare_replay(bs, step, md)
    rows = ref_slot_rows(step.slot_mapping, scratch_slot, spec.block_size)
    _assert_same(md.slot_mapping, rows[0])
    _assert_same(md.kv_rows, rows[1:])
    indptr, indices, last = ref_paged_kv(step, spec.block_size, num_blocks, spec.max_blocks_per_seq)
    _assert_same(state.paged_kv_indptr[: bs + 1], indptr)
    _assert_same(state.paged_kv_indices[: len(indices)], indices)
    _assert_same(state.paged_kv_last_page_len[:bs], last)


def test_small_decode_host_with_fewer_tables_than_rows():
    """Padded lanes past the last (empty) table are scratch-filled, as when the builder
    sliced the list of tables itself."""
    from vllm.attention.backends.flashinfer.small_decode import small_decode_host

    step = StepInputs(ForwardMode.DECODE, [0, 0], [1, 1], [[]], [-1, -1], 0)
    assert small_decode_host(step, 9).tolist() == [0, 0, 9, 9]
