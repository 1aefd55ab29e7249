"""Physical KV blocks of one virtual engine: reference counts, the prefix-cache hash table and
the eviction order (no torch).

A block is in exactly one of three states:

* **in use**: ``ref_count >= 1`` (held by that many block tables);
* **free, cached**: ``ref_count == 0`` but its hash is still in the table, so a later request
  with the same prefix can take it back without recomputing it (it is *evictable*);
* **free, empty**: ``ref_count == 0`` and no hash.

A fresh block comes from the empty ones first (lowest number first, so allocation order is
deterministic), then by evicting a cached one: the least recently freed, and among blocks
freed at the same time the one deepest in its sequence (its children are useless without it
being kept, but not the other way round: a deep block is only hit after all its ancestors).

Block identity (prefix caching): a *full* block's hash is the SHA-256 digest of the
request's ``extra_keys`` and every token id from the sequence's start to the block's end
(:func:`hash_full_blocks`), so equal hashes mean equal token prefixes and keys. SHA-256, as
upstream's default ``--prefix-caching-hash-algo``, because a prompt's tokens are the
client's to choose: with a 64-bit non-cryptographic hash (Python's ``hash`` of a tuple of
ints, which upstream used before) a client can build a prompt whose block collides with
another tenant's and be served its KV. ``extra_keys`` are the request's
``Sequence.block_hash_keys``: what changes the KV of equal tokens (the LoRA adapter) and
who may share them (the prompt's ``cache_salt``); empty for most requests.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections.abc import Sequence as Seq


def hash_full_blocks(token_ids: Seq[int], block_size: int, extra_keys: tuple = ()) -> list[bytes]:
    """Hashes of the ``len(token_ids) // block_size`` full blocks of a token sequence, in
    order (the last partial block, if any, has none).

    Block i's hash is the 32-byte SHA-256 digest of ``repr(extra_keys)`` (after its length,
    so no key text can run into the tokens) followed by token ids ``0 .. (i + 1) *
    block_size - 1`` as 8-byte integers in this machine's byte order: one running hash,
    copied at each block's end (a chain of per-block hashes identifies the same prefix
    but costs a hash object and a byte string per block). ``extra_keys`` hold ints,
    strings and tuples of them, whose ``repr`` tells them apart.
    """
    n = len(token_ids) // block_size
    if n == 0:
        return []
    keys = repr(extra_keys).encode()
    running = hashlib.sha256(len(keys).to_bytes(8, "little") + keys)
    data = memoryview(array("q", token_ids[: n * block_size]).tobytes())
    step = 8 * block_size
    hashes: list[bytes] = []
    for end in range(step, n * step + 1, step):
        running.update(data[end - step : end])
        hashes.append(running.copy().digest())
    return hashes


class BlockPool:
    """Reference-counted physical blocks ``0 .. num_blocks - 1`` with an optional prefix cache.

    Args:
        num_blocks: how many blocks (>= 1).
        enable_caching: keep freed full blocks findable by hash until evicted. Off: freed
            blocks go straight back to the empty list and :meth:`lookup` finds nothing.

    Raises:
        ValueError: when num_blocks is below 1.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = False):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}.")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_count = [0] * num_blocks
        # Min-heap of free, empty blocks; range() is already a valid heap.
        self._empty: list[int] = list(range(num_blocks))
        # Prefix cache: hash -> block, and each registered block's hash and depth (tokens of
        # its sequence up to and including this block).
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._depth: dict[int, int] = {}
        # Evictable (free, cached) blocks: block -> stamp, and a heap of
        # (stamp, -depth, block) whose stale entries are skipped when popped.
        self._evictable: dict[int, int] = {}
        self._evict_heap: list[tuple[int, int, int]] = []
        self._clock = 0
        self.num_evictions = 0  # cached blocks handed out again since the start

    # ----------------------------------------------------------------------------- queries
    def num_free(self) -> int:
        """Blocks that can be handed out now: empty plus evictable."""
        return len(self._empty) + len(self._evictable)

    def num_cached(self) -> int:
        """Blocks findable by hash (in use or evictable)."""
        return len(self._by_hash)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block registered under ``block_hash``, or None."""
        return self._by_hash.get(block_hash)

    # ----------------------------------------------------------------------------- changes
    def take(self, n: int) -> list[int]:
        """``n`` fresh blocks (ref_count 1, no hash): empty ones first, then evicted ones.

        Raises:
            RuntimeError: when fewer than ``n`` blocks are free (nothing is taken then).
        """
        if n > self.num_free():
            raise RuntimeError(f"need {n} blocks, {self.num_free()} free of {self.num_blocks}.")
        out = []
        for _ in range(n):
            block = heapq.heappop(self._empty) if self._empty else self._evict_one()
            self.ref_count[block] = 1
            out.append(block)
        return out

    def acquire(self, block: int) -> None:
        """One more reference to a cached block (taking it back from the evictable set when it
        was free)."""
        if self.ref_count[block] == 0:
            if block not in self._evictable:
                raise RuntimeError(f"block {block} is neither in use nor cached.")
            del self._evictable[block]
        self.ref_count[block] += 1

    def register(self, block: int, block_hash: bytes, depth: int) -> bool:
        """Make the in-use ``block`` findable under ``block_hash`` (``depth``: tokens of its
        sequence up to its end). A hash already registered keeps its block and this one
        stays private. Returns whether it was registered (always False with caching off)."""
        if not self.enable_caching or block_hash in self._by_hash:
            return False
        self._by_hash[block_hash] = block
        self._hash_of[block] = block_hash
        self._depth[block] = depth
        return True

    def release(self, blocks: Seq[int]) -> None:
        """Drop one reference to each of ``blocks`` (one table's blocks, freed together: they
        share an eviction stamp). A block whose count reaches 0 becomes evictable when it
        has a hash, else empty.

        Raises:
            RuntimeError: when a block is not in use (a double free); blocks before it in the
                list have been released.
        """
        self._clock += 1
        stamp = self._clock
        for block in blocks:
            count = self.ref_count[block]
            if count <= 0:
                raise RuntimeError(f"block {block} freed twice (its reference count is 0).")
            self.ref_count[block] = count - 1
            if count > 1:
                continue
            if block in self._hash_of:
                self._evictable[block] = stamp
                heapq.heappush(self._evict_heap, (stamp, -self._depth[block], block))
            else:
                heapq.heappush(self._empty, block)
        if len(self._evict_heap) > 2 * len(self._evictable) + 64:  # drop stale entries
            self._evict_heap = [(s, -self._depth[b], b) for b, s in self._evictable.items()]
            heapq.heapify(self._evict_heap)

    def forget(self, blocks: Seq[int]) -> int:
        """Drop the hashes of ``blocks`` (those that have one): an evictable block becomes
        empty, a block in use becomes private (empty once released). For blocks whose keys
        may never have been written (a failed step). Returns how many hashes were dropped."""
        dropped = 0
        for block in blocks:
            block_hash = self._hash_of.pop(block, None)
            if block_hash is None:
                continue
            del self._by_hash[block_hash]
            del self._depth[block]
            if self._evictable.pop(block, None) is not None:  # its heap entry goes stale
                heapq.heappush(self._empty, block)
            dropped += 1
        return dropped

    def reset(self) -> int:
        """Forget every hash: evictable blocks become empty, blocks in use become private
        (empty once released). Returns how many hashes were dropped."""
        dropped = len(self._by_hash)
        for block in self._evictable:
            heapq.heappush(self._empty, block)
        self._evictable.clear()
        self._evict_heap.clear()
        self._by_hash.clear()
        self._hash_of.clear()
        self._depth.clear()
        return dropped

    def _evict_one(self) -> int:
        while True:
            stamp, _, block = heapq.heappop(self._evict_heap)
            if self._evictable.get(block) == stamp:
                break
        del self._evictable[block]
        del self._by_hash[self._hash_of.pop(block)]
        del self._depth[block]
        self.num_evictions += 1
        return block
