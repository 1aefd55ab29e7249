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


def test_request_preempted_for_priority_and_admitted_again_keeps_running():
    """A request preempted for a waiting one of higher priority that cannot run yet (its
    LoRA adapter would be one above max_loras, so admission passes over it) is admitted
    again in the same step: it stays in the running queue and runs to its end. Guards: the
    preempted requests were dropped from the running queue after admission, so that
    request left both queues and was never finished (its output lost, the engine idle)."""
    from vllm.lora.request import LoRARequest

    sched_cfg = SimpleNamespace(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=256,
                                num_lookahead_slots=0, policy="priority")  # fmt: skip
    cache_cfg = SimpleNamespace(block_size=4, num_gpu_blocks=64, enable_prefix_caching=False)
    sched = Scheduler(sched_cfg, cache_cfg, SimpleNamespace(max_loras=1))
    groups = {}
    for rid, prio, t, lora_id in (("a", 5, 1.0, 1), ("a-low", 10, 2.0, 1), ("b", 0, 3.0, 2)):
        groups[rid] = g = add(sched, rid, 4, prio, t)
        g.lora_request = LoRARequest(f"l{lora_id}", lora_id, "/x")
        if rid == "a-low":
            _, out = sched.schedule()
            assert ids(out.scheduled_seq_groups) == ["a", "a-low"]
            run_model(out)
    # b (adapter 2) has no seat: a-low gives its seat, but b cannot run beside adapter 1,
    # so admission passes over b and takes a-low back at once
    _, out = sched.schedule()
    assert out.preempted == 1 and ids(out.scheduled_seq_groups) == ["a-low"]
    assert ids(sched.running) == ["a", "a-low"] and ids(sched.waiting) == ["b"]
    finished: list[str] = []
    for _ in range(20):  # every request gets 3 tokens and finishes; b after adapter 1's
        run_model(out)
        for g in out.scheduled_seq_groups:
            if g.seqs[0].get_output_len() >= 3:
                finish(g)
        finished += sched.free_finished_seq_groups()
        if not sched.has_unfinished_seqs():
            break
        _, out = sched.schedule()
        assert out.scheduled_seq_groups, (ids(sched.running), ids(sched.waiting))
    assert sorted(finished) == ["a", "a-low", "b"] and finished[-1] == "b"
