"""The "priority" scheduling policy (``--scheduling-policy priority``, upstream V0's).

Each request carries an integer priority (``LLM.generate(..., priority=[...])``,
``AsyncLLMEngine.generate(..., priority=p)``, the server's ``priority`` field); lower
values are served first, ties by arrival time. Before every schedule:

1. The waiting and the running queues are sorted by (priority, arrival time). Admission
   then takes the waiting queue in that order, and a decode step that runs out of blocks
   preempts from the back of the running queue, i.e. the lowest priority first.
2. **Priority preemption.** When the first waiting request cannot be admitted (too few free
   KV-cache blocks, or ``max_num_seqs`` sequences already running) while some running
   request has a lower priority (a larger value, or the same value and a later arrival),
   the lowest such running request is preempted by recompute, and again, until the waiting
   one fits or no lower-priority request is left. A request that can never run is not
   preempted for (the scheduler finishes it as ignored), and a running request whose
   recompute could never be scheduled is never preempted for priority (it would be cut
   short).

With the default "fcfs" policy none of this runs and every priority must be 0.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from vllm.core.block_manager import AllocStatus
from vllm.sequence import SequenceGroup

# The scheduler imports this module: its class is named in docstrings, typed Any here.
Scheduler = Any


def priority_key(group: SequenceGroup) -> tuple[int, float]:
    """(priority, arrival time): the order of service, smallest first."""
    return group.priority, group.metrics.arrival_time


def order_and_preempt(sched: Scheduler) -> list[SequenceGroup]:
    """Sort ``sched``'s queues by :func:`priority_key` and preempt running requests of
    lower priority than the first waiting one while it does not fit (module docstring).

    Returns:
        the groups preempted (already back in the waiting queue, in order).
    """
    sched.running.sort(key=priority_key)
    waiting = sorted(sched.waiting, key=priority_key)
    sched.waiting = deque(waiting)
    head = next((g for g in waiting if g.get_unfinished_seqs()), None)
    if head is None or sched._never_fits(head) is not None:
        return []
    need = len(head.get_unfinished_seqs())
    max_seqs = sched.scheduler_config.max_num_seqs
    preempted: list[SequenceGroup] = []
    head_key = priority_key(head)
    while True:
        victims = [g for g in sched.running if not g.is_finished()]
        if not victims or priority_key(victims[-1]) <= head_key:
            break
        running_seqs = sum(g.get_max_num_running_seqs() for g in victims)
        fits_blocks = sched.block_manager.can_allocate(head) == AllocStatus.OK
        if fits_blocks and running_seqs + need <= max_seqs:
            break
        # the lowest priority first, passing over a group whose recompute could never be
        # scheduled (preempting it would cut it short)
        victim = next(
            (g for g in reversed(victims) if priority_key(g) > head_key and sched.can_recompute(g)),
            None,
        )
        if victim is None:
            break
        sched.running.remove(victim)
        sched._preempt(victim)
        preempted.append(victim)
    if preempted:
        sched.waiting = deque(sorted(sched.waiting, key=priority_key))
    return preempted
