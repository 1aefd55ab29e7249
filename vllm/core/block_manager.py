"""Paged KV-cache block accounting for one virtual engine (no torch).

The KV cache of a virtual engine is cut into ``num_gpu_blocks`` physical blocks of
``block_size`` token slots each, numbered ``0 .. num_gpu_blocks - 1``. (The cache owner keeps
one more scratch block, numbered ``num_gpu_blocks``, that padded graph lanes write to; this
manager never hands it out.) Every sequence owns one *block table*: the ordered list of physical
blocks whose slots hold its tokens, token ``i`` living in block ``table[i // block_size]`` at
offset ``i % block_size``.

Simplifications against upstream vLLM V0 (``BlockSpaceManagerV1``): no block sharing between the
``n`` sequences of a request (each gets its own table, the prompt is computed once per
sequence), no prefix caching, no swapping to CPU (preemption is by recompute only).

Free blocks are kept in a min-heap, so the lowest-numbered free block is always handed out
first: allocation order is deterministic and a test can steer a sequence onto any block,
including the last one, ``num_gpu_blocks - 1``.
"""

from __future__ import annotations

import enum
import heapq

from vllm.sequence import Sequence, SequenceGroup, SequenceStatus


class AllocStatus(enum.Enum):
    """Answer of :meth:`BlockSpaceManager.can_allocate` for a waiting request.

    OK: it fits now. LATER: it fits once running requests free blocks. NEVER: it cannot fit
    even in an empty cache (the scheduler ignores it rather than waiting forever).
    """

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockSpaceManager:
    """Owns the free list and every sequence's block table for one virtual engine.

    Args:
        block_size: token slots per block (>= 1).
        num_gpu_blocks: physical blocks available to sequences (>= 1); blocks are numbered
            ``0 .. num_gpu_blocks - 1``.
        watermark: fraction of all blocks kept free when admitting a new request, so running
            requests have room to grow (upstream default 0.01). ``watermark_blocks`` =
            ``int(watermark * num_gpu_blocks)``.

    Raises:
        ValueError: when block_size or num_gpu_blocks is below 1, or watermark is outside
            [0, 1); the message names the value.
    """

    def __init__(self, block_size: int, num_gpu_blocks: int, watermark: float = 0.01):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}.")
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1, got {num_gpu_blocks}.")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}.")
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        # Min-heap of free physical block numbers; range() is already a valid heap.
        self._free: list[int] = list(range(num_gpu_blocks))
        # seq_id -> physical block numbers, in token order.
        self._tables: dict[int, list[int]] = {}

    # ----------------------------------------------------------------------------- queries
    def get_num_free_gpu_blocks(self) -> int:
        return len(self._free)

    def get_num_total_gpu_blocks(self) -> int:
        return self.num_total_gpu_blocks

    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_total_gpu_blocks

    def has_table(self, seq: Sequence) -> bool:
        return seq.seq_id in self._tables

    def get_block_table(self, seq: Sequence) -> list[int]:
        """A copy of ``seq``'s block table (physical block numbers in token order).

        Raises:
            KeyError: when ``seq`` has no table (never allocated, or already freed).
        """
        return list(self._table_of(seq))

    def live_block_table(self, seq: Sequence) -> list[int]:
        """``seq``'s block table itself, not a copy (the scheduler hands it to the worker).

        Callers must not modify it. It grows in place when the sequence gets more slots
        (:meth:`append_slots`), so it is read within the step it was scheduled for; a
        freed sequence's list is dropped, never reused.

        Raises:
            KeyError: when ``seq`` has no table.
        """
        return self._table_of(seq)

    def _table_of(self, seq: Sequence) -> list[int]:
        table = self._tables.get(seq.seq_id)
        if table is None:
            raise KeyError(f"sequence {seq.seq_id} has no block table (not allocated or freed).")
        return table

    def _blocks_to_cover(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` lacks so that its table covers ``num_tokens`` token slots."""
        have = len(self._tables.get(seq.seq_id, ()))
        return max(0, _cdiv(num_tokens, self.block_size) - have)

    # ---------------------------------------------------------------------------- prefill
    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Whether the group's unfinished sequences can get fresh tables now.

        Needed blocks = sum over unfinished sequences of ceil(seq.get_len() / block_size)
        (prompt plus any outputs kept by a recompute preemption).

        Returns:
            NEVER when even an empty cache, minus the watermark, is too small
            (``num_gpu_blocks - needed < watermark_blocks``; this also covers
            ``needed > num_gpu_blocks``), LATER when ``free - needed < watermark_blocks``,
            else OK.
        """
        needed = sum(_cdiv(s.get_len(), self.block_size) for s in seq_group.get_unfinished_seqs())
        if self.num_total_gpu_blocks - needed < self.watermark_blocks:
            return AllocStatus.NEVER
        if len(self._free) - needed < self.watermark_blocks:
            return AllocStatus.LATER
        return AllocStatus.OK

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give each WAITING sequence of the group a table covering ``seq.get_len()`` tokens.

        Raises:
            ValueError: when one of those sequences already has a table.
            RuntimeError: when fewer blocks are free than needed (names both counts); nothing
                is allocated in that case.
        """
        seqs = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in seqs:
            if seq.seq_id in self._tables:
                raise ValueError(
                    f"sequence {seq.seq_id} of request {seq_group.request_id} already has a "
                    f"block table of {len(self._tables[seq.seq_id])} blocks."
                )
        needed = sum(_cdiv(s.get_len(), self.block_size) for s in seqs)
        self._check_free(needed, seq_group.request_id)
        for seq in seqs:
            self._tables[seq.seq_id] = self._take(_cdiv(seq.get_len(), self.block_size))

    # ----------------------------------------------------------------------------- decode
    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """Whether every RUNNING sequence of the group can grow by this step's slots.

        A decode step writes the KV of the last token (position ``len - 1``) and, with
        speculative decoding, ``num_lookahead_slots`` positions after it, so each table must
        cover ``seq.get_len() + num_lookahead_slots`` tokens. No watermark applies here.
        """
        needed = sum(
            self._blocks_to_cover(s, s.get_len() + num_lookahead_slots)
            for s in seq_group.get_seqs(SequenceStatus.RUNNING)
        )
        return needed <= len(self._free)

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> None:
        """Grow ``seq``'s table to cover ``seq.get_len() + num_lookahead_slots`` tokens.

        Tables never shrink: slots reserved for rejected speculative tokens stay reserved.

        Raises:
            KeyError: when ``seq`` has no table.
            RuntimeError: when fewer blocks are free than needed.
        """
        table = self._table_of(seq)
        extra = self._blocks_to_cover(seq, seq.get_len() + num_lookahead_slots)
        if extra:
            self._check_free(extra, f"sequence {seq.seq_id}")
            table.extend(self._take(extra))

    def try_append_slots(self, seqs: list[Sequence], num_lookahead_slots: int = 0) -> bool:
        """All or nothing: grow every table of ``seqs`` as :meth:`append_slots` does when
        :meth:`can_append_slots` would allow it for those sequences, else change nothing.

        The scheduler's decode path: one call per group with its RUNNING sequences (the
        same arithmetic as the two calls, without re-listing the group).

        Returns:
            True when the tables were grown (or needed nothing), False when fewer blocks are
            free than the sequences need together.

        Raises:
            KeyError: when one of ``seqs`` has no table.
        """
        bs = self.block_size
        tables = self._tables
        if len(seqs) == 1:  # n == 1: the common case, no lists
            seq = seqs[0]
            table = tables.get(seq.seq_id)
            if table is None:
                table = self._table_of(seq)
            extra = (seq.data.get_len() + num_lookahead_slots + bs - 1) // bs - len(table)
            if extra <= 0:
                return True
            if extra > len(self._free):
                return False
            table.extend(self._take(extra))
            return True
        extras = []
        for seq in seqs:
            table = self._table_of(seq)
            extras.append((seq.data.get_len() + num_lookahead_slots + bs - 1) // bs - len(table))
        if sum(e for e in extras if e > 0) > len(self._free):
            return False
        for seq, extra in zip(seqs, extras):
            if extra > 0:
                tables[seq.seq_id].extend(self._take(extra))
        return True

    # ------------------------------------------------------------------------------- free
    def free(self, seq: Sequence) -> None:
        """Return ``seq``'s blocks to the free list and drop its table.

        Raises:
            KeyError: when ``seq`` has no table (freed twice, or never allocated).
        """
        table = self._tables.pop(seq.seq_id, None)
        if table is None:
            raise KeyError(
                f"cannot free sequence {seq.seq_id}: it has no block table "
                "(already freed, or never allocated)."
            )
        for block in table:
            heapq.heappush(self._free, block)

    # ---------------------------------------------------------------------------- helpers
    def _check_free(self, needed: int, who: str) -> None:
        if needed > len(self._free):
            raise RuntimeError(
                f"out of KV-cache blocks for {who}: need {needed}, {len(self._free)} free of "
                f"{self.num_total_gpu_blocks}."
            )

    def _take(self, n: int) -> list[int]:
        return [heapq.heappop(self._free) for _ in range(n)]
