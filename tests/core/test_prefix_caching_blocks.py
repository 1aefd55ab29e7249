"""Prefix caching in the block manager alone (no torch): hashing (and a block forged to
collide with a cached one under the old 64-bit hash), sharing, reference counts,
LRU eviction, and a randomised run of allocate / append / free / reset checked against a
model of which tokens each block holds."""

import itertools
import random

import pytest

from vllm.core.block_manager import BlockSpaceManager
from vllm.core.block_pool import BlockPool, hash_full_blocks
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

_ids = itertools.count()


def group(tokens, bs, n=1, rid="r", prompt_logprobs=None):
    seqs = [Sequence(next(_ids), None, list(tokens), bs) for _ in range(n)]
    sp = SamplingParams(n=n, temperature=1.0 if n > 1 else 0.0, prompt_logprobs=prompt_logprobs)
    return SequenceGroup(rid, seqs, sp)


def run(bm, g):
    bm.allocate(g)
    for s in g.seqs:
        s.status = SequenceStatus.RUNNING


def test_hash_covers_the_whole_prefix_and_the_extra_keys():
    a = hash_full_blocks([1, 2, 3, 4, 5], 2)
    assert len(a) == 2 and all(len(h) == 32 for h in a)  # the partial block [5] has none
    assert a == hash_full_blocks([1, 2, 3, 4], 2) and a[:1] == hash_full_blocks([1, 2], 2)
    assert hash_full_blocks([9, 9, 3, 4], 2)[1] != a[1]  # same tokens, other prefix
    assert hash_full_blocks([1, 2], 2, (("lora", 1),))[0] != a[0]
    assert hash_full_blocks([1, 2], 2, ("a",)) != hash_full_blocks([1, 2], 2, ("a", ""))
    assert hash_full_blocks([1, 2], 4) == []


# CPython's tuple hash (64-bit; Objects/tupleobject.c): what a block's identity was before
# SHA-256. Each step is invertible, so a block colliding with any given one can be solved for.
_P1, _P2, _P5, _MASK = 11400714785074694791, 14029467366897019727, 2870177450012600261, 2**64 - 1


def _lanes_state(items) -> int:
    acc = _P5
    for x in items:
        acc = (acc + (hash(x) & _MASK) * _P2) & _MASK
        acc = (((acc << 31) | (acc >> 33)) & _MASK) * _P1 & _MASK
    return acc


def _colliding_block(victim: tuple[int, ...]) -> tuple[int, ...]:
    """Another block of ``len(victim)`` ints whose ``hash`` equals ``hash(victim)``: all but
    the last token chosen, the last one solved for."""
    target = (_lanes_state(victim) * pow(_P1, -1, 2**64)) & _MASK
    target = ((target >> 31) | (target << 33)) & _MASK  # undo the rotation
    for t in itertools.count(1):
        head = tuple(range(1000, 1000 + len(victim) - 2)) + (t,)
        lane = (target - _lanes_state(head)) * pow(_P2, -1, 2**64) & _MASK
        last = lane if lane < 2**61 - 1 else lane - 2**64  # an int whose hash is the lane
        if hash(last) & _MASK == lane:
            return head + (last,)
    raise AssertionError("unreachable")


def test_a_block_built_to_collide_with_a_cached_one_is_not_served_its_kv():
    """A prompt block whose Python hash equals another request's (solvable, see above) must
    not find that request's cached KV: the block identity is SHA-256 of the tokens."""
    bs = 16
    victim = tuple(range(100, 100 + bs))
    forged = _colliding_block(victim)
    if hash(forged) != hash(victim):  # another interpreter's tuple hash
        pytest.skip("needs CPython's 64-bit tuple hash to build the collision")
    assert forged != victim
    bm = BlockSpaceManager(bs, 8, watermark=0.0, enable_caching=True)
    run(bm, group(list(victim) + [7], bs, rid="victim"))
    assert bm.num_cached_prefix_tokens(list(victim) + [7]) == bs
    assert bm.num_cached_prefix_tokens(list(forged) + [7]) == 0
    g = group(list(forged) + [7], bs, rid="forged")
    run(bm, g)
    assert bm.get_num_cached_tokens(g.seqs[0]) == 0


@pytest.mark.parametrize("prefix_blocks", [0, 1, 3])
def test_second_request_shares_its_cached_prefix(prefix_blocks):
    bs = 4
    bm = BlockSpaceManager(bs, 32, watermark=0.0, enable_caching=True)
    shared = list(range(100, 100 + prefix_blocks * bs))
    g1 = group(shared + [1, 2, 3, 4, 5, 6], bs, rid="a")
    g2 = group(shared + [7, 8, 9], bs, rid="b")
    run(bm, g1)
    run(bm, g2)
    t1, t2 = bm.get_block_table(g1.seqs[0]), bm.get_block_table(g2.seqs[0])
    assert t2[:prefix_blocks] == t1[:prefix_blocks]
    assert not set(t2[prefix_blocks:]) & set(t1)
    assert bm.get_num_cached_tokens(g2.seqs[0]) == prefix_blocks * bs
    assert bm.num_hit_tokens == prefix_blocks * bs
    assert bm.num_queried_tokens == len(g1.seqs[0].get_token_ids()) + len(shared) + 3
    assert bm.get_num_free_gpu_blocks() == 32 - len(set(t1) | set(t2))


def test_whole_prompt_cached_still_computes_its_last_block():
    bs = 4
    bm = BlockSpaceManager(bs, 16, watermark=0.0, enable_caching=True)
    tokens = list(range(1, 13))  # exactly 3 blocks
    g1, g2 = group(tokens, bs, rid="a"), group(tokens, bs, rid="b")
    run(bm, g1)
    run(bm, g2)
    # (12 - 1) // 4 = 2 blocks from the cache; the third is computed into a fresh block.
    assert bm.get_num_cached_tokens(g2.seqs[0]) == 8
    t1, t2 = bm.get_block_table(g1.seqs[0]), bm.get_block_table(g2.seqs[0])
    assert t2[:2] == t1[:2] and t2[2] != t1[2]
    # One token more than k blocks: all k blocks come from the cache.
    g3 = group(tokens + [50], bs, rid="c")
    run(bm, g3)
    assert bm.get_num_cached_tokens(g3.seqs[0]) == 12
    assert bm.get_block_table(g3.seqs[0])[:3] == t1


def test_siblings_share_prompt_blocks_and_prompt_logprobs_read_nothing():
    bs = 4
    bm = BlockSpaceManager(bs, 32, watermark=0.0, enable_caching=True)
    g = group(list(range(1, 11)), bs, n=4)  # 2 full blocks + 2 tokens
    run(bm, g)
    tables = [bm.get_block_table(s) for s in g.seqs]
    assert all(t[:2] == tables[0][:2] for t in tables)
    assert len({t[2] for t in tables}) == 4  # the partial block is private
    assert [bm.get_num_cached_tokens(s) for s in g.seqs] == [0, 8, 8, 8]
    assert bm.pool.ref_count[tables[0][0]] == 4
    assert bm.get_num_free_gpu_blocks() == 32 - 6
    gl = group(list(range(1, 11)), bs, rid="pl", prompt_logprobs=1)
    run(bm, gl)
    assert bm.get_num_cached_tokens(gl.seqs[0]) == 0
    for s in g.seqs + gl.seqs:
        bm.free(s)
    assert bm.get_num_free_gpu_blocks() == 32


def test_free_cached_blocks_are_reused_then_evicted_lru_deepest_first():
    bs = 2
    bm = BlockSpaceManager(bs, 6, watermark=0.0, enable_caching=True)
    old = group([1, 2, 3, 4, 5], bs, rid="old")  # blocks 0, 1 hashed; 2 partial
    run(bm, old)
    bm.free(old.seqs[0])
    newer = group([7, 8, 9], bs, rid="newer")  # empty blocks first: 2 hashed, 3 partial
    run(bm, newer)
    bm.free(newer.seqs[0])
    assert bm.get_num_free_gpu_blocks() == 6 and bm.pool.num_cached() == 3
    # 5 fresh blocks: empty 3, 4, 5 first, then evict the oldest release's deepest (1),
    # then its parent (0); block 2 (released later) stays cached.
    g = group([20, 21, 22, 23, 24, 25, 26, 27, 28], bs, rid="g")
    run(bm, g)
    assert bm.get_block_table(g.seqs[0]) == [3, 4, 5, 1, 0]
    assert bm.pool.num_evictions == 2
    assert bm.pool.lookup(hash_full_blocks([7, 8], bs)[0]) == 2
    assert bm.pool.lookup(hash_full_blocks([1, 2], bs)[0]) is None


def test_double_free_raises_and_reset_forgets():
    pool = BlockPool(4, enable_caching=True)
    (b,) = pool.take(1)
    assert pool.register(b, 123, 2)
    pool.release([b])
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.release([b])
    assert pool.lookup(123) == b and pool.num_free() == 4
    assert pool.reset() == 1
    assert pool.lookup(123) is None and pool.num_free() == 4
    assert not BlockPool(2, enable_caching=False).register(0, 5, 1)


def test_forget_takes_a_failed_prefills_blocks_out_of_the_cache():
    """After a failed step the blocks its prefill was to write are forgotten: in use they
    stay in the table but become private, and once freed they are empty, so a request with
    the same prompt finds nothing and computes it; other cached blocks stay findable."""
    bs = 2
    bm = BlockSpaceManager(bs, 8, watermark=0.0, enable_caching=True)
    kept = group([9, 9, 9], bs, rid="kept")  # block 0 hashed, block 1 partial
    run(bm, kept)
    bm.free(kept.seqs[0])
    failed = group([1, 2, 3, 4, 5], bs, rid="failed")  # blocks 2, 3 hashed, 4 partial
    run(bm, failed)
    table = bm.get_block_table(failed.seqs[0])
    assert bm.forget_cached(failed.seqs[0]) == 2
    assert bm.get_block_table(failed.seqs[0]) == table  # its table is untouched
    assert bm.pool.lookup(hash_full_blocks([1, 2], bs)[0]) is None
    bm.free(failed.seqs[0])
    assert bm.get_num_free_gpu_blocks() == 8 and bm.pool.num_cached() == 1
    again = group([1, 2, 3, 4, 5], bs, rid="again")
    run(bm, again)
    assert bm.get_num_cached_tokens(again.seqs[0]) == 0
    assert bm.pool.lookup(hash_full_blocks([9, 9], bs)[0]) == 0
    # an evictable block forgotten becomes empty (taken before any eviction)
    pool = BlockPool(3, enable_caching=True)
    a, b = pool.take(2)
    pool.register(a, b"a", 2)
    pool.register(b, b"b", 2)
    pool.release([a, b])
    assert pool.forget([a]) == 1 and pool.forget([a]) == 0
    assert pool.lookup(b"a") is None and pool.num_free() == 3
    assert sorted(pool.take(2)) == sorted([a, 2]) and pool.num_evictions == 0
    assert pool.lookup(b"b") == b


def test_random_operations_against_a_model():
    """Allocate (n = 1..3, prompts from a few shared prefixes), append, free and reset at
    random; after every operation: reference counts equal table memberships, the free count
    equals blocks in no table, a sequence's cached blocks hold exactly its tokens (checked
    against the tokens each block was last written with), and with caching off nothing is
    ever cached."""
    rng = random.Random(0)
    bs, num_blocks = 4, 40
    for caching in (True, False):
        bm = BlockSpaceManager(bs, num_blocks, watermark=0.0, enable_caching=caching)
        content: dict[int, tuple] = {}  # block -> tokens written into it
        live: list[Sequence] = []
        prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(0, 14))] for _ in range(4)]
        for step in range(600):
            op = rng.random()
            if op < 0.45:
                toks = rng.choice(prefixes) + [
                    rng.randrange(1, 50) for _ in range(rng.randrange(1, 9))
                ]
                g = group(toks, bs, n=rng.randrange(1, 4), rid=str(step))
                if bm.can_allocate(g).name != "OK":
                    continue
                run(bm, g)
                for s in g.seqs:
                    t, c = bm.get_block_table(s), bm.get_num_cached_tokens(s)
                    assert c % bs == 0 and c <= len(toks) - 1 and (caching or c == 0)
                    for i in range(c // bs):  # read from the cache: must hold our tokens
                        assert content[t[i]] == tuple(toks[i * bs : (i + 1) * bs])
                    for i in range(c // bs, len(t)):  # computed now: written
                        content[t[i]] = tuple(toks[i * bs : (i + 1) * bs])
                    live.append(s)
            elif op < 0.75 and live:
                s = rng.choice(live)
                tok = rng.randrange(1, 50)
                s.append_token_id(tok, {tok: Logprob(0.0)})
                if bm.try_append_slots([s]):
                    t, n = bm.get_block_table(s), s.get_len()
                    b = t[(n - 1) // bs]
                    assert bm.pool.ref_count[b] == 1  # decode writes a private block only
                    start = (n - 1) // bs * bs
                    content[b] = tuple(s.get_token_ids()[start:n])
                else:
                    bm.free(s)
                    live.remove(s)
            elif op < 0.98 and live:
                s = live.pop(rng.randrange(len(live)))
                bm.free(s)
            else:
                bm.reset_prefix_cache()
            held = [b for s in live for b in bm.get_block_table(s)]
            for b in range(num_blocks):
                assert bm.pool.ref_count[b] == held.count(b)
            assert bm.get_num_free_gpu_blocks() == num_blocks - len(set(held))
            assert caching or bm.pool.num_cached() == 0
        for s in live:
            bm.free(s)
        assert bm.get_num_free_gpu_blocks() == num_blocks
        if caching:
            assert bm.num_hit_tokens > 0
