"""Lookahead slots (multi-step decoding, speculative decoding) are reserved only up to the
last position a sequence can feed the model, ``max_model_len - 2``: no call writes past it.

Reserving the full lookahead near the limit preempted requests for slots nobody writes: a
lone request in a cache that holds exactly one ``max_model_len`` sequence was preempted
and recomputed for each of its last tokens, and a request near the limit preempted others.
The model is simulated as in test_scheduler.py (one token per step)."""

from tests.core.test_scheduler import make_group, make_scheduler, run_model
from vllm.sequence import SequenceStatus

# 4 blocks of 4 tokens: exactly one sequence of max_model_len = 16 tokens
BS, BLOCKS, LIMIT = 4, 4, 16


def _drive(sched, target: dict[str, int]) -> list[list[int]]:
    """Step until every group reached its target length (or max_model_len); returns the
    first group's block table after each decode step."""
    tables = []
    for _ in range(100):
        meta, out = sched.schedule()
        if meta and not meta[0].is_prompt:
            tables.append(next(iter(meta[0].block_tables.values())))
        run_model(out)
        for g in out.scheduled_seq_groups:
            for s in g.get_seqs(SequenceStatus.RUNNING):
                if s.get_len() >= min(target[g.request_id], LIMIT):
                    s.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        sched.free_finished_seq_groups()
        if not sched.has_unfinished_seqs():
            return tables
    raise AssertionError("the requests did not finish")


def test_lone_request_in_an_exact_cache_is_never_preempted():
    """7 lookahead slots (8 scheduler steps), a 10-token prompt run to max_model_len: each
    decode reserves up to position 14 at most, so the 4 blocks always suffice."""
    sched = make_scheduler(block_size=BS, num_gpu_blocks=BLOCKS, max_model_len=LIMIT,
                           num_lookahead_slots=7)  # fmt: skip
    sched.add_seq_group(make_group("lone", 10, block_size=BS))
    tables = _drive(sched, {"lone": LIMIT})
    assert sched.num_cumulative_preemption == 0, "preempted with the whole cache free"
    assert len(tables) == LIMIT - 10 - 1  # decode steps after the prefill's token
    assert all(len(t) == BLOCKS for t in tables), tables
    free = sched.block_manager.get_num_free_gpu_blocks()
    assert free == sched.block_manager.get_num_total_gpu_blocks()


def test_lookahead_far_from_the_limit_is_reserved_in_full():
    """Below the limit nothing changes: a 5-token sequence with 3 lookahead slots covers
    5 + 3 = 8 slots (2 blocks), as before."""
    sched = make_scheduler(block_size=BS, num_gpu_blocks=16, max_model_len=64,
                           num_lookahead_slots=3)  # fmt: skip
    g = make_group("far", 4, block_size=BS)
    sched.add_seq_group(g)
    _, out = sched.schedule()
    run_model(out)  # 5 tokens
    meta, out = sched.schedule()
    assert out.num_lookahead_slots == 3
    assert len(meta[0].block_tables[g.seqs[0].seq_id]) == 2


def test_request_near_the_limit_does_not_preempt_another():
    """8 blocks of 4, limit 16, 3 lookahead slots: "near" (prompt 13) and "other" (prompt
    12) both run to the limit. Each needs slots up to position 14 only (4 blocks each, the
    whole cache); reserving the full lookahead (near at 14 tokens: 17 slots, 5 blocks)
    left other short of a block and preempted it."""
    sched = make_scheduler(block_size=BS, num_gpu_blocks=8, max_model_len=LIMIT,
                           num_lookahead_slots=3)  # fmt: skip
    sched.add_seq_group(make_group("near", 13, block_size=BS))
    sched.add_seq_group(make_group("other", 12, block_size=BS))
    _drive(sched, {"near": LIMIT, "other": LIMIT})
    assert sched.num_cumulative_preemption == 0, "near preempted other for unused slots"
