"""Preemption never cuts a request short: a group whose recompute could never be scheduled
(n sequences whose prompt plus outputs together exceed max_num_batched_tokens, without
chunked prefill) is not chosen as a victim, by decode preemption or by priority
preemption. The model is simulated as in test_scheduler.py."""

from tests.core.test_priority_scheduling import add, make_priority_scheduler
from tests.core.test_scheduler import ids, make_group, make_scheduler, run_model
from vllm.sequence import SequenceStatus


def _drive(sched, target_len: dict[str, int], max_steps: int = 200) -> tuple[int, list]:
    """Step the simulated model until every group finished (each sequence at its group's
    ``target_len``); returns (preemptions, groups ignored on the way)."""
    ignored = []
    for _ in range(max_steps):
        _, out = sched.schedule()
        ignored += out.ignored_seq_groups
        run_model(out)
        for g in out.scheduled_seq_groups:
            for s in g.get_seqs(SequenceStatus.RUNNING):
                if s.get_len() >= target_len[g.request_id]:
                    s.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        sched.free_finished_seq_groups()
        if not sched.has_unfinished_seqs():
            return sched.num_cumulative_preemption, ignored
    raise AssertionError(f"stuck: running {ids(sched.running)}, waiting {ids(sched.waiting)}")


def test_decode_preemption_passes_over_a_group_it_could_not_recompute():
    """Budget 16 tokens, 8 blocks of 4. "solo" (4 tokens) and "pair" (n = 2, 6 tokens each,
    a 12-token prefill) run together until the cache runs out with pair at 9+ tokens each:
    its recompute (18+ tokens) could never be scheduled, so solo, first in line, preempts
    itself instead, and both run to max_model_len. Guards: pair (the last running group)
    was preempted, then finished as ignored with 5 of its 10 tokens."""
    sched = make_scheduler(num_gpu_blocks=8, max_num_batched_tokens=16, max_model_len=16)
    solo, pair = make_group("solo", 4), make_group("pair", 6, n=2)
    sched.add_seq_group(solo)
    sched.add_seq_group(pair)
    preemptions, ignored = _drive(sched, {"solo": 16, "pair": 16})
    assert ids(ignored) == []
    assert [s.get_output_len() for s in pair.seqs] == [10, 10]
    assert solo.seqs[0].get_output_len() == 12
    assert preemptions == 1  # solo, once
    assert sched.block_manager.get_num_free_gpu_blocks() == 8


def test_group_waits_for_an_earlier_one_rather_than_being_preempted():
    """8 blocks of 4. "early" (13 tokens) is first in line and takes the last free block;
    "pair" (n = 2, 9 tokens each: a recompute of 18 > 16 tokens) then finds no block and no
    victim it may take: it waits a step with its blocks and outputs, and finishes whole.
    Guards: pair preempted itself at 2 of its 9 tokens (its recompute then ignored)."""
    sched = make_scheduler(num_gpu_blocks=8, max_num_batched_tokens=16, max_model_len=16)
    early, pair = make_group("early", 12), make_group("pair", 7, n=2)
    sched.add_seq_group(early)
    _, out = sched.schedule()
    run_model(out)
    sched.add_seq_group(pair)
    for _ in range(2):  # pair's prefill, then a decode of both
        _, out = sched.schedule()
        run_model(out)
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["early"] and out.preempted == 0
    assert [(s.get_len(), s.status) for s in pair.seqs] == [(9, SequenceStatus.RUNNING)] * 2
    assert ids(sched.running) == ["early", "pair"]
    run_model(out)
    preemptions, ignored = _drive(sched, {"early": 16, "pair": 16})
    assert ids(ignored) == [] and preemptions == 0
    assert [s.get_output_len() for s in pair.seqs] == [9, 9]
    assert early.seqs[0].get_output_len() == 4


def test_priority_preemption_passes_over_a_group_it_could_not_recompute():
    """A waiting request of higher priority does not preempt a running n = 2 group whose
    recompute could never be scheduled: it waits until the group finishes. Guards: the
    group was preempted for it and finished as ignored with 3 of its 10 tokens."""
    sched = make_priority_scheduler(num_gpu_blocks=8)
    sched.scheduler_config.max_num_batched_tokens = 16
    sched.scheduler_config.max_model_len = 16
    pair = make_group("pair", 6, n=2)
    pair.priority, pair.metrics.arrival_time = 1, 1.0
    sched.add_seq_group(pair)
    _, out = sched.schedule()
    for _ in range(3):  # 9 tokens each: 3 blocks each, 2 free
        run_model(out)
        _, out = sched.schedule()
    urgent = add(sched, "urgent", 12, 0, 2.0)  # needs 3 blocks
    preemptions, ignored = _drive(sched, {"pair": 16, "urgent": 14})
    assert ids(ignored) == [] and preemptions == 0
    assert [s.get_output_len() for s in pair.seqs] == [10, 10]
    assert urgent.seqs[0].get_output_len() == 2
