"""Paged KV-cache block accounting for one virtual engine (no torch).

The KV cache of a virtual engine is cut into ``num_gpu_blocks`` physical blocks of
``block_size`` token slots each, numbered ``0 .. num_gpu_blocks - 1``. (The cache owner keeps
one more scratch block, numbered ``num_gpu_blocks``, that padded graph lanes write to; this
manager never hands it out.) Every sequence owns one *block table*: the ordered list of physical
blocks whose slots hold its tokens, token ``i`` living in block ``table[i // block_size]`` at
offset ``i % block_size``.

Blocks live in a :class:`~vllm.core.block_pool.BlockPool`: reference counted, with empty
blocks handed out lowest number first, so allocation order is deterministic and a test can
steer a sequence onto any block, including the last one, ``num_gpu_blocks - 1``.

Prefix caching (``enable_caching``): when a sequence is allocated for a prefill, each of its
full blocks is looked up by hash (see ``block_pool``). The leading run of hits is shared (one
more reference each) and its tokens are the sequence's *cached* tokens: the prefill computes
only the rest, attending to them through the paged cache. The other full blocks are fresh
and registered under their hash, so the next request (or a sibling of the same request, in
the same step: every layer writes the step's keys before it attends) finds them; the last
partial block is always private. At most ``(len - 1) // block_size`` blocks are taken from
the cache, so the prefill always computes at least the last token (it needs its logits) and
only ever writes into fresh blocks, never into a shared one. Blocks that fill up while
decoding are not hashed (a preempted sequence's recompute hashes them). A request that asks
for prompt logprobs reads nothing from the cache (those need every prompt position) but
still registers its blocks.

With chunked prefill (``defer_registration``) a prompt's table is allocated whole at its
first chunk, but its fresh full blocks are registered only once the chunk that computes them
is scheduled (:meth:`mark_computed`), so no other request can take a block whose keys are
not written yet; the siblings of an ``n > 1`` request then find exactly the blocks the first
sequence found, and all of them start their chunks at the same position.

Admission (``can_allocate``) counts every block of the request as if nothing were cached,
so scheduling decisions are the same with caching on and off; cached blocks that are free
still count as free.

No swapping to CPU (preemption is by recompute only).
"""

from __future__ import annotations

import enum

from vllm.core.block_pool import BlockPool, hash_full_blocks
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
        enable_caching: automatic prefix caching (see the module docstring).
        defer_registration: chunked prefill: register fresh full blocks in
            :meth:`mark_computed`, not at allocation (see the module docstring).

    Raises:
        ValueError: when block_size or num_gpu_blocks is below 1, or watermark is outside
            [0, 1); the message names the value.
    """

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        watermark: float = 0.01,
        enable_caching: bool = False,
        defer_registration: bool = False,
    ):
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
        self.enable_caching = enable_caching
        self.defer_registration = defer_registration
        # seq_id -> fresh full blocks not registered yet: (block, hash, tokens up to its end).
        self._unregistered: dict[int, list[tuple[int, bytes, int]]] = {}
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        # seq_id -> physical block numbers, in token order.
        self._tables: dict[int, list[int]] = {}
        # seq_id -> tokens found in the prefix cache at its last allocation.
        self._cached_tokens: dict[int, int] = {}
        # Prefix-cache counters in prompt tokens (prefills that may read the cache only).
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # ----------------------------------------------------------------------------- queries
    def get_num_free_gpu_blocks(self) -> int:
        """Blocks that can be handed out: empty ones plus free cached ones."""
        return self.pool.num_free()

    def get_num_total_gpu_blocks(self) -> int:
        return self.num_total_gpu_blocks

    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1]."""
        return 1.0 - self.pool.num_free() / self.num_total_gpu_blocks

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

    def get_num_cached_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` found in the prefix cache when it was last allocated (0 when
        caching is off, or for a sequence never allocated); a multiple of block_size."""
        return self._cached_tokens.get(seq.seq_id, 0)

    def num_cached_prefix_tokens(self, token_ids: list[int], hash_keys: tuple = ()) -> int:
        """Tokens of a prompt ``token_ids`` that an allocation now would find cached: the
        leading full blocks present in the cache, capped as :meth:`allocate` caps them
        (0 with caching off). Reads only; used to route requests between virtual engines.
        ``hash_keys``: the sequences' ``block_hash_keys``."""
        if not self.enable_caching or not token_ids:
            return 0
        hits = 0
        bs = self.block_size
        for h in hash_full_blocks(token_ids[: (len(token_ids) - 1) // bs * bs], bs, hash_keys):
            if self.pool.lookup(h) is None:
                break
            hits += 1
        return hits * bs

    def group_prefill_tokens(self, token_ids: list[list[int]], hash_keys: tuple = ()) -> int:
        """Tokens the prefill of a group's sequences (``token_ids``, one list each, in
        allocation order) computes if allocated now: the first one's length less its
        prefix found in the cache (:meth:`num_cached_prefix_tokens`); each later one's
        length less the leading full blocks it shares with an earlier sibling, whose
        allocation registers them before the later one looks them up (the n sequences of
        a request share their whole prompt but its last partial block). Siblings' own
        cache hits beyond those are not counted, so the result may exceed what is
        computed, never fall short of it. Without caching: the sum of the lengths.
        ``hash_keys``: the sequences' ``block_hash_keys``."""
        if not self.enable_caching:
            return sum(len(ids) for ids in token_ids)
        bs = self.block_size
        total = 0
        held: set[bytes] = set()  # full blocks of earlier siblings
        for i, ids in enumerate(token_ids):
            if i == 0:
                total += len(ids) - self.num_cached_prefix_tokens(ids, hash_keys)
            else:
                hits = 0
                for h in hash_full_blocks(ids[: (len(ids) - 1) // bs * bs], bs, hash_keys):
                    if h not in held:
                        break
                    hits += 1
                total += len(ids) - hits * bs
            if i + 1 < len(token_ids):  # only later siblings look these up
                held.update(hash_full_blocks(ids, bs, hash_keys))
        return total

    def hit_rate(self) -> float:
        """Cached prompt tokens / looked-up prompt tokens since the start (0.0 before any)."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (see :meth:`BlockPool.reset`); tables in use keep their
        blocks. Returns how many hashes were dropped."""
        return self.pool.reset()

    def forget_cached(self, seq: Sequence) -> int:
        """Take ``seq``'s blocks out of the prefix cache (they stay in its table): after a
        failed step that was to write them, no later request may find them. Returns how
        many hashes were dropped (0 when ``seq`` has no table)."""
        self._unregistered.pop(seq.seq_id, None)
        return self.pool.forget(self._tables.get(seq.seq_id, ()))

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
    def blocks_needed(self, seq_lens: list[int], shared_prefix: int = 0) -> int:
        """Fresh blocks that sequences of ``seq_lens`` tokens of one request take at
        allocation: ceil(len / block_size) each, less, for every sequence after the first,
        the full blocks of the ``shared_prefix`` tokens all of them start with (the
        prompt; 0 when the request reads no cache, with prompt logprobs) up to its last
        token's block: with caching on and the blocks registered at allocation (not
        chunked prefill) a sibling finds the first sequence's blocks and shares them.
        Cached blocks of earlier requests are not counted off."""
        bs = self.block_size
        share = shared_prefix // bs if self.enable_caching and not self.defer_registration else 0
        needed = _cdiv(seq_lens[0], bs) if seq_lens else 0
        for n in seq_lens[1:]:
            needed += _cdiv(n, bs) - min(share, (n - 1) // bs)
        return needed

    def _group_blocks(self, seqs: list[Sequence], seq_group: SequenceGroup) -> int:
        """:meth:`blocks_needed` of ``seqs`` of ``seq_group`` (they share its prompt)."""
        return self.blocks_needed([s.get_len() for s in seqs], seq_group.shared_prompt_len)

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Whether the group's unfinished sequences can get fresh tables now.

        Needed blocks: :meth:`blocks_needed` of the unfinished sequences (prompt plus any
        outputs kept by a recompute preemption; siblings share the prompt's full blocks
        when caching registers them at allocation).

        Returns:
            NEVER when even an empty cache, minus the watermark, is too small
            (``num_gpu_blocks - needed < watermark_blocks``; this also covers
            ``needed > num_gpu_blocks``), LATER when ``free - needed < watermark_blocks``,
            else OK.
        """
        needed = self._group_blocks(seq_group.get_unfinished_seqs(), seq_group)
        if self.num_total_gpu_blocks - needed < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.pool.num_free() - needed < self.watermark_blocks:
            return AllocStatus.LATER
        return AllocStatus.OK

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give each WAITING sequence of the group a table covering ``seq.get_len()`` tokens.

        With caching on, full blocks already cached are shared (see the module docstring)
        and :meth:`get_num_cached_tokens` tells how many tokens the prefill may skip.

        Raises:
            ValueError: when one of those sequences already has a table.
            RuntimeError: when fewer blocks are free than the group would need with nothing
                cached (names both counts); nothing is allocated in that case.
        """
        seqs = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in seqs:
            if seq.seq_id in self._tables:
                raise ValueError(
                    f"sequence {seq.seq_id} of request {seq_group.request_id} already has a "
                    f"block table of {len(self._tables[seq.seq_id])} blocks."
                )
        self._check_free(self._group_blocks(seqs, seq_group), seq_group.request_id)
        reads_cache = seq_group.sampling_params.prompt_logprobs is None
        for seq in seqs:
            self._tables[seq.seq_id] = self._allocate_seq(seq, reads_cache)

    def _allocate_seq(self, seq: Sequence, reads_cache: bool) -> list[int]:
        """A new table for ``seq`` covering ``seq.get_len()`` tokens (caller checked room)."""
        bs, pool, n = self.block_size, self.pool, seq.get_len()
        total = _cdiv(n, bs)
        if not self.enable_caching:
            self._cached_tokens[seq.seq_id] = 0
            return pool.take(total)
        hashes = hash_full_blocks(seq.get_token_ids(), bs, seq.block_hash_keys)
        max_hits = (n - 1) // bs if reads_cache else 0
        table: list[int] = []
        for h in hashes[:max_hits]:
            block = pool.lookup(h)
            if block is None:
                break
            pool.acquire(block)
            table.append(block)
        hits = len(table)
        later: list[tuple[int, bytes, int]] = []
        for i in range(hits, len(hashes)):
            block = pool.take(1)[0]
            if self.defer_registration:
                later.append((block, hashes[i], (i + 1) * bs))
            else:
                pool.register(block, hashes[i], (i + 1) * bs)
            table.append(block)
        if later:
            self._unregistered[seq.seq_id] = later
        table.extend(pool.take(total - len(table)))
        self._cached_tokens[seq.seq_id] = hits * bs
        if reads_cache:
            self.num_queried_tokens += n
            self.num_hit_tokens += hits * bs
        return table

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """Chunked prefill: the step being scheduled computes ``seq``'s tokens up to
        ``num_tokens``; register its fresh full blocks that end at or before it (a no-op
        without ``defer_registration`` or caching)."""
        pending = self._unregistered.get(seq.seq_id)
        if not pending:
            return
        i = 0
        while i < len(pending) and pending[i][2] <= num_tokens:
            self.pool.register(*pending[i])
            i += 1
        if i == len(pending):
            del self._unregistered[seq.seq_id]
        elif i:
            self._unregistered[seq.seq_id] = pending[i:]

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
        return needed <= self.pool.num_free()

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
            table.extend(self.pool.take(extra))

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
            if extra > self.pool.num_free():
                return False
            table.extend(self.pool.take(extra))
            return True
        extras = []
        for seq in seqs:
            table = self._table_of(seq)
            extras.append((seq.data.get_len() + num_lookahead_slots + bs - 1) // bs - len(table))
        if sum(e for e in extras if e > 0) > self.pool.num_free():
            return False
        for seq, extra in zip(seqs, extras):
            if extra > 0:
                tables[seq.seq_id].extend(self.pool.take(extra))
        return True

    # ------------------------------------------------------------------------------- free
    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s table and one reference to each of its blocks: unshared blocks
        become free (cached ones stay findable until evicted).

        Raises:
            KeyError: when ``seq`` has no table (freed twice, or never allocated).
        """
        table = self._tables.pop(seq.seq_id, None)
        if table is None:
            raise KeyError(
                f"cannot free sequence {seq.seq_id}: it has no block table "
                "(already freed, or never allocated)."
            )
        self._cached_tokens.pop(seq.seq_id, None)
        self._unregistered.pop(seq.seq_id, None)
        self.pool.release(table)

    # ---------------------------------------------------------------------------- helpers
    def _check_free(self, needed: int, who: str) -> None:
        free = self.pool.num_free()
        if needed > free:
            raise RuntimeError(
                f"out of KV-cache blocks for {who}: need {needed}, {free} free of "
                f"{self.num_total_gpu_blocks}."
            )
