"""Host-side array helpers shared by the attention backends' metadata builders.

A step carries its block tables as Python lists (one list of block numbers per row). The
builders run on the host every decode step, so they turn those ragged lists into numpy
arrays once, with one pass over the Python ints, and do the rest (page counts, clipping,
gathers, slot arithmetic) as whole-array operations instead of per-row Python loops.

The ragged layout used here: ``flat`` holds every row's table back to back and ``lens``
the number of entries per row, so row ``i`` is ``flat[starts[i] : starts[i] + lens[i]]``
with ``starts = exclusive_cumsum(lens)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np


def flatten_tables(tables: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ragged block tables.

    Returns ``flat`` [sum(lens)] int64 (every row's blocks back to back) and ``lens``
    [rows] int64 (blocks per row).
    """
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))  # [rows]
    total = int(lens.sum())
    flat = np.fromiter(chain.from_iterable(tables), dtype=np.int64, count=total)  # [total]
    return flat, lens


@dataclass(frozen=True)
class FlatTables:
    """One step's block tables flattened once (:func:`flatten_tables`, int64): ``flat``
    [entries], ``lens`` [rows] and ``starts = exclusive_cumsum(lens)`` [rows + 1].

    The steps of one multi-step call share their tables (the lookahead blocks were
    reserved before the call), so the later steps reuse the first step's flattening
    (:func:`step_tables`) instead of walking every Python list again each token (256 rows
    of about 70 blocks: FLASHINFER's page tables and the next step's inputs took 586 us
    per step with the walk, 213 us without, on a 2-core CPU).
    """

    flat: np.ndarray
    lens: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, tables: list[list[int]]) -> FlatTables:
        """Flatten ``tables`` (one list of block numbers per row)."""
        flat, lens = flatten_tables(tables)
        return cls(flat, lens, exclusive_cumsum(lens))

    def head(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``(flat, lens)`` of the first ``rows`` rows, or of every row when there are
        fewer (views, no copy; as slicing the list of tables would give)."""
        if rows >= len(self.lens):
            return self.flat, self.lens
        return self.flat[: self.starts[rows]], self.lens[:rows]

    def first_short(self, need: np.ndarray) -> int:
        """The first row whose table has fewer blocks than ``need`` [rows] int64 asks of
        the first ``len(need)`` rows, or -1 when every one is long enough."""
        short = need > self.lens[: len(need)]  # [rows]
        return int(np.argmax(short)) if short.any() else -1

    @cached_property
    def cols(self) -> np.ndarray:
        """[entries] int64: each entry's column in its row (:func:`ragged_positions`)."""
        return ragged_positions(self.lens, self.starts)


def step_tables(step: Any) -> FlatTables:
    """The :class:`FlatTables` of ``step.block_tables`` (a ``StepInputs``), computed on the
    first call and kept on the step (``step.flat_tables``) for every later builder and for
    the later steps of a multi-step call, which share the tables."""
    ft = step.flat_tables
    if ft is None:
        ft = FlatTables.of(step.block_tables)
        step.flat_tables = ft
    return ft


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """[n + 1] int64 offsets ``[0, c0, c0 + c1, ...]`` of ``counts`` [n]."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def ragged_positions(counts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Position of each element inside its row for a ragged layout: for ``counts``
    [rows] and their ``offsets = exclusive_cumsum(counts)`` [rows + 1], returns
    [offsets[-1]] int64 ``[0, 1, ..., c0 - 1, 0, 1, ..., c1 - 1, ...]``."""
    total = int(offsets[-1])
    return np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], counts)


def scratch_slots(slots: list[int], scratch_slot: int) -> np.ndarray:
    """[num_tokens] int64 slot mapping with padded lanes (slot -1) sent to ``scratch_slot``
    (docs/design.md "Padded lanes": they write the scratch block, never a real one)."""
    s = np.fromiter(slots, dtype=np.int64, count=len(slots))  # [num_tokens]
    return np.where(s < 0, scratch_slot, s)
