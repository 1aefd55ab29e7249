"""The scheduler's per-step fast paths keep the slow paths' answers (CPU, no torch).

- ``BlockSpaceManager.try_append_slots`` is all-or-nothing and equals ``can_append_slots``
  followed by ``append_slots`` for each sequence;
- the metadata carries the block manager's own tables (no copy per step), which grow in
  place;
- ``free_finished_seq_groups`` makes one pass over the running groups; a waiting group
  found finished leaves the queue when ``schedule`` reaches it and is reported once;
- a long randomized run (n > 1, lookahead slots, preemption, finishing) matches a
  re-computation of every invariant from scratch after each step.
"""

import itertools
import random
from types import SimpleNamespace

from vllm.core.block_manager import BlockSpaceManager
from vllm.core.scheduler import Scheduler
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

_ids = itertools.count()


def make_group(rid: str, prompt_len: int, block_size: int = 4, n: int = 1) -> SequenceGroup:
    seqs = [
        Sequence(next(_ids), None, list(range(100, 100 + prompt_len)), block_size) for _ in range(n)
    ]
    return SequenceGroup(rid, seqs, SamplingParams(n=n, temperature=0.0))


def make_scheduler(num_gpu_blocks=64, max_num_seqs=8, num_lookahead_slots=0, block_size=4):
    sched_cfg = SimpleNamespace(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
        max_model_len=512,
        num_lookahead_slots=num_lookahead_slots,
    )
    cache_cfg = SimpleNamespace(block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    return Scheduler(sched_cfg, cache_cfg)


def grow(seq: Sequence, k: int) -> None:
    for _ in range(k):
        seq.append_token_id(5, {5: Logprob(-0.5)})


def test_try_append_slots_is_all_or_nothing():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=5, watermark=0.0)
    g = make_group("pair", 4, n=2)
    bm.allocate(g)
    for s in g.seqs:
        s.status = SequenceStatus.RUNNING
    assert bm.get_num_free_gpu_blocks() == 3
    # Each sequence at length 5 needs 1 block more, with 4 lookahead slots 2 more: 4 > 3.
    for s in g.seqs:
        grow(s, 1)
    assert not bm.can_append_slots(g, 4)
    assert not bm.try_append_slots(g.seqs, 4)
    assert [bm.get_block_table(s) for s in g.seqs] == [[0], [1]]  # nothing taken
    assert bm.get_num_free_gpu_blocks() == 3
    assert bm.try_append_slots(g.seqs, 0)  # 1 block each
    assert [bm.get_block_table(s) for s in g.seqs] == [[0, 2], [1, 3]]
    assert bm.try_append_slots(g.seqs, 0)  # nothing needed: still True, nothing taken
    assert bm.get_num_free_gpu_blocks() == 1
    one = g.seqs[:1]
    assert bm.try_append_slots(one, 4)  # single-sequence path: 9 slots -> 3 blocks
    assert bm.get_block_table(g.seqs[0]) == [0, 2, 4]
    assert not bm.try_append_slots(one, 8)  # 13 slots -> 4 blocks, none free


def test_metadata_tables_are_the_live_tables():
    sched = make_scheduler(num_lookahead_slots=0)
    g = make_group("r", 4)
    sched.add_seq_group(g)
    meta, _ = sched.schedule()
    seq = g.seqs[0]
    table = meta[0].block_tables[seq.seq_id]
    assert table is sched.block_manager.live_block_table(seq) and table == [0]
    assert sched.block_manager.get_block_table(seq) is not table  # the public copy
    grow(seq, 1)  # length 5: the decode step needs a second block
    meta, _ = sched.schedule()
    assert meta[0].block_tables[seq.seq_id] is table and table == [0, 1]


def test_finished_waiting_group_leaves_when_reached_and_is_reported_once():
    sched = make_scheduler(max_num_seqs=1)
    a, b, c = make_group("a", 4), make_group("b", 4), make_group("c", 4)
    for g in (a, b, c):
        sched.add_seq_group(g)
    _, out = sched.schedule()
    assert [g.request_id for g in out.scheduled_seq_groups] == ["a"]
    b.seqs[0].status = SequenceStatus.FINISHED_ABORTED  # finished while waiting
    assert sched.free_finished_seq_groups() == []  # the waiting queue is not scanned
    a.seqs[0].status = SequenceStatus.FINISHED_STOPPED
    assert sched.free_finished_seq_groups() == ["a"]
    _, out = sched.schedule()  # passes over b (finished), admits c
    assert [g.request_id for g in out.scheduled_seq_groups] == ["c"]
    assert [g.request_id for g in sched.waiting] == []
    assert sched.free_finished_seq_groups() == ["b"]
    assert sched.free_finished_seq_groups() == []
    assert not sched.block_manager.has_table(b.seqs[0])


def _check_invariants(sched: Scheduler, groups: list[SequenceGroup]) -> None:
    bm = sched.block_manager
    held = []
    for g in groups:
        for s in g.seqs:
            if s.status == SequenceStatus.RUNNING:
                # scheduled with room for its last token (and k lookahead slots on decode
                # steps), then grown by one token
                assert len(bm.get_block_table(s)) * bm.block_size >= s.get_len() - 1
                held += bm.get_block_table(s)
            elif bm.has_table(s):  # finished, not yet freed
                assert s.is_finished()
                held += bm.get_block_table(s)
    assert len(held) == len(set(held))  # no block in two tables
    assert len(held) + bm.get_num_free_gpu_blocks() == bm.get_num_total_gpu_blocks()
    for g in sched.running:
        assert not g.is_finished()
    for g in sched.waiting:
        assert all(s.status != SequenceStatus.RUNNING for s in g.seqs)


def test_randomized_run_keeps_block_and_queue_invariants():
    rng = random.Random(0)
    k = 2
    sched = make_scheduler(num_gpu_blocks=24, max_num_seqs=8, num_lookahead_slots=k)
    groups = [
        make_group(f"r{i}", rng.randint(1, 12), n=rng.choice([1, 1, 2, 3])) for i in range(30)
    ]
    for g in groups:
        sched.add_seq_group(g)
    preempted = 0
    for _ in range(2000):
        if not sched.has_unfinished_seqs():
            break
        meta, out = sched.schedule()
        preempted += out.preempted
        for md, g in zip(meta, out.scheduled_seq_groups):
            running = g.get_seqs(SequenceStatus.RUNNING)
            assert list(md.seq_data) == [s.seq_id for s in running]
            for s in running:
                assert md.block_tables[s.seq_id] == sched.block_manager.get_block_table(s)
        for g in out.scheduled_seq_groups:  # "the model": one token each, random stops
            for s in g.get_seqs(SequenceStatus.RUNNING):
                grow(s, 1)
                if rng.random() < 0.03 or s.get_output_len() >= 30:
                    s.status = SequenceStatus.FINISHED_STOPPED
        sched.free_finished_seq_groups()
        _check_invariants(sched, groups)
    assert not sched.has_unfinished_seqs() and preempted > 0
    assert sched.block_manager.get_num_free_gpu_blocks() == 24
