"""The "priority" scheduling policy (vllm/core/priority.py): admission in (priority,
arrival) order, decode preemption from the lowest priority, and a waiting request of higher
priority preempting running ones of lower priority when it does not fit. The model is
simulated as in test_scheduler.py."""

from types import SimpleNamespace

from tests.core.test_scheduler import finish, ids, make_group, run_model
from vllm.core.scheduler import Scheduler


def make_priority_scheduler(num_gpu_blocks=64, max_num_seqs=8, policy="priority", **kw):
    sched_cfg = SimpleNamespace(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=256, max_model_len=256,
        num_lookahead_slots=0, policy=policy, **kw,
    )  # fmt: skip
    cache_cfg = SimpleNamespace(block_size=4, num_gpu_blocks=num_gpu_blocks,
                                enable_prefix_caching=False)  # fmt: skip
    return Scheduler(sched_cfg, cache_cfg)


def add(sched, rid: str, prompt_len: int, priority: int, arrival: float):
    g = make_group(rid, prompt_len)
    g.priority = priority
    g.metrics.arrival_time = arrival
    sched.add_seq_group(g)
    return g


def test_admission_follows_priority_then_arrival():
    sched = make_priority_scheduler(max_num_seqs=2)
    for rid, prio, t in (("late-low", 5, 1.0), ("b", 0, 3.0), ("a", 0, 2.0), ("urgent", -1, 4.0)):
        add(sched, rid, 4, prio, t)
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["urgent", "a"]
    assert ids(sched.waiting) == ["b", "late-low"]
    # The same arrivals under fcfs: queue order
    fcfs = make_priority_scheduler(max_num_seqs=2, policy="fcfs")
    for rid, prio, t in (("late-low", 5, 1.0), ("b", 0, 3.0), ("a", 0, 2.0), ("urgent", -1, 4.0)):
        add(fcfs, rid, 4, prio, t)
    _, out = fcfs.schedule()
    assert ids(out.scheduled_seq_groups) == ["late-low", "b"]


def test_waiting_request_preempts_lower_priority_for_seats():
    sched = make_priority_scheduler(max_num_seqs=2)
    low = add(sched, "low", 4, 10, 1.0)
    add(sched, "mid", 4, 5, 2.0)
    _, out = sched.schedule()
    run_model(out)
    assert ids(sched.running) == ["mid", "low"]
    add(sched, "high", 4, 0, 3.0)  # no seat left: the lowest running one gives its seat
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["high"] and out.preempted == 1
    assert ids(sched.running) == ["mid", "high"] and ids(sched.waiting) == ["low"]
    assert sched.num_cumulative_preemption == 1
    assert low.seqs[0].get_output_len() == 1  # recompute keeps its output
    # A waiting request of lower priority than every running one preempts nobody.
    add(sched, "lowest", 4, 20, 4.0)
    run_model(out)
    _, out = sched.schedule()
    assert out.preempted == 0 and ids(out.scheduled_seq_groups) == ["high", "mid"]
    assert ids(sched.waiting) == ["low", "lowest"]


def test_waiting_request_preempts_lower_priority_for_blocks():
    # 6 blocks of 4 tokens; two 12-token prompts take all of them.
    sched = make_priority_scheduler(num_gpu_blocks=6)
    add(sched, "x", 12, 1, 1.0)
    add(sched, "y", 12, 2, 2.0)
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["x", "y"]
    add(sched, "z", 8, 0, 3.0)  # needs 2 blocks: y (lowest) is preempted, x keeps running
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["z"] and out.preempted == 1
    assert ids(sched.waiting) == ["y"]
    # Equal priority: the earlier arrival keeps its blocks, the later one waits.
    sched = make_priority_scheduler(num_gpu_blocks=6)
    add(sched, "x", 12, 1, 1.0)
    add(sched, "y", 12, 1, 2.0)
    sched.schedule()
    add(sched, "z", 8, 1, 3.0)
    _, out = sched.schedule()
    assert out.preempted == 0 and ids(sched.waiting) == ["z"]


def test_decode_preemption_takes_the_lowest_priority():
    # 3 blocks; three 4-token prompts fill them; each needs a new block for its 5th token.
    sched = make_priority_scheduler(num_gpu_blocks=3)
    add(sched, "p2", 4, 2, 1.0)
    add(sched, "p0", 4, 0, 2.0)
    add(sched, "p1", 4, 1, 3.0)
    _, out = sched.schedule()
    run_model(out)
    _, out = sched.schedule()  # p0 needs a block: the lowest (p2), then p1, are preempted
    assert ids(out.scheduled_seq_groups) == ["p0"] and out.preempted == 2
    assert ids(sched.waiting) == ["p1", "p2"]
    finish(sched.running[0])
    sched.free_finished_seq_groups()
    _, out = sched.schedule()
    assert ids(out.scheduled_seq_groups) == ["p1"]  # 5 tokens: 2 of the 3 blocks each
