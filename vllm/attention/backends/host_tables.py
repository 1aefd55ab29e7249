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

from itertools import chain

import numpy as np


def flatten_tables(
    tables: list[list[int]], dtype: type = np.int64
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ragged block tables.

    Returns ``flat`` [sum(lens)] of ``dtype`` (every row's blocks back to back) and
    ``lens`` [rows] int64 (blocks per row).
    """
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))  # [rows]
    total = int(lens.sum())
    flat = np.fromiter(chain.from_iterable(tables), dtype=dtype, count=total)  # [total]
    return flat, lens


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
