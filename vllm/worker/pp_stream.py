"""A pipeline stage serving calls as they arrive (PP > 1, TP = 1, the mp executor).

Rounds (vllm/worker/pp_stage.py) interleave the passes of calls submitted together, and
the pipeline empties between rounds while the engine processes their outputs and
schedules the next ones. A stream instead admits each call when it arrives, at most one
unfinished call per virtual engine (VE; the engine keeps one in flight per VE): while the
engine processes VE 0's outputs and schedules its next call, the stages go on running VE
1's passes, and VE 0's next call joins the rotation as soon as it is read. The same
passes run (``PipelineStage._forward``, ``_sample``, ``_advance``): only their order
and the headers differ.

Order. Stage 0 decides it: its unfinished calls rotate, one pass each (a call that ran a
pass goes to the back; a call read from the executor's pipe joins at the front, its first
pass needing no sampled ids), so the next pass is always that of the call whose last
pass is the oldest. Every pass sends a header
down the pipeline before the hidden states: stage 0's plan of the call
(``pp_stage.HEADER_FIELDS``; checked against each stage's own at a call's first pass,
``check_plan_agreement``) and the pass index. A later stage runs passes in header order,
finding the call by its VE (reading the executor's pipe until that call's message arrives
if need be). Sampled ids travel back to stage 0 in the order the last stage samples, which
is the order stage 0 needs them: the rotation keeps the calls' relative order.

A stage never blocks on its neighbour alone while a call from the executor may be
queued: stage 0, before it waits for a pass's sampled ids (its batch already advanced),
and a later stage, before it waits for the next header, wait on that message and on the
executor's pipe at once (``CallSource.wait``; the host channel's pipe and the worker's
inbox pipe), so a call that arrives meanwhile is prepared while the pipeline still
works, and on stage 0 its first pass runs before the pass still waiting for ids. Without
host channels (gloo) or for ids on CUDA (NCCL, where the host never waits) they block
in the receive as before.

The last stage samples one pass behind its forwards, as in rounds, so its host samples
while its device runs the next pass; before it waits for the next header it samples
the oldest launched pass while every unfinished call whose first header it has seen has
one waiting to be sampled. That is the case exactly when stage 0 may be waiting for those
ids: stage 0 runs a call's pass right after its previous one only when that call is the
only one in its rotation, and every call the last stage has seen a header of and not
finished is in stage 0's rotation (a call it has read but not seen a header of may not
be yet). A call's output is sent to the executor as soon as its last pass is sampled.

Messages. The stream reads the executor's messages in their order: a step joins, a
``free`` is applied at once (its sequences belong to calls every stage has finished), and
any other message (a call of a worker method, shutdown) ends admission: the stream runs
its unfinished calls to the end and returns, and the worker loop handles that message
next. Every stage sees the same messages in the same order, so they admit the same calls.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

import torch

from vllm.distributed import communication as comm
from vllm.worker.pp_stage import HEADER_FIELDS, PipelineStage, _Call

# the header of a pass in a stream: the plan, then the pass index
STREAM_HEADER_LEN = len(HEADER_FIELDS) + 1


class CallSource:
    """What a stream reads from and replies to (the worker loop, vllm/worker/worker_process.py).

    Args:
        next_call: ``next_call(block)``: the next call's ``(tag, request)``, or None when
            none is queued (``block`` False) or a message that ends admission comes
            first.
        reply: ``reply(tag, output)``: send a call's output (the sampling rank).
        wait_fd: a file descriptor readable while a message not yet taken by
            ``next_call`` is queued, or None: then a stage waiting on its neighbour does
            not watch for calls meanwhile.
    """

    def __init__(
        self,
        next_call: Callable[[bool], Any],
        reply: Callable[[Any, Any], None],
        wait_fd: int | None = None,
    ):
        self.next_call = next_call
        self.reply = reply
        self.wait_fd = wait_fd

    def wait(self, fd: int | None) -> bool:
        """Block until ``fd`` (a neighbour's message) or :attr:`wait_fd` is readable.
        Returns True when ``fd`` is (or cannot be waited on: None), False when only a
        message from the executor is: the caller admits it first."""
        if fd is None or self.wait_fd is None:
            return True
        ready, _, _ = select.select([fd, self.wait_fd], [], [])
        return fd in ready


class StreamingStage(PipelineStage):
    """A :class:`PipelineStage` that serves calls as they arrive (module doc)."""

    streaming = True

    def __init__(self, worker: Any, group):
        super().__init__(worker, group)
        self.calls: dict[int, _Call] = {}  # VE -> its unfinished call on this stage
        self.rotation: list[_Call] = []  # stage 0: the order of the next passes
        self.pending: list[tuple[_Call, int, Any]] = []  # last stage: launched, not sampled

    def stream(self, tag: Any, request, source: CallSource) -> None:
        """Serve ``request`` (the call ``tag``) and every call that follows it, until none
        is unfinished on this stage and none is queued before a message that ends
        admission.

        Raises:
            RuntimeError: a header names a VE no call was read for, or a pass index this
                stage did not expect; a stage disagrees with stage 0 on a call's plan.
        """
        self._admit(tag, request, source)
        while True:
            while (item := source.next_call(False)) is not None:
                self._admit(*item, source)
            if self.last:
                self._sample_stuck(source)
            if not self.calls:
                return
            if self.first:
                self._next_pass_first(source)
            else:
                self._next_pass(source)

    def _admit(self, tag: Any, request, source: CallSource) -> None:
        """Prepare a call read from the executor (the last stage answers an empty one)."""
        if not request.seq_group_metadata_list:
            if self.last:
                source.reply(tag, None)
            return
        ve = request.virtual_engine
        if ve in self.calls:
            raise RuntimeError(
                f"pipeline stage {self.rank} got a second call of virtual engine {ve} while "
                "its previous call is unfinished (one call per virtual engine is in flight)"
            )
        self.times.steps += 1
        call = self._start(request)
        call.tag = tag
        self.calls[ve] = call
        self.times.calls_at_once = max(self.times.calls_at_once, len(self.calls))
        if self.first:
            self.rotation.insert(0, call)  # runs next: its first pass needs no ids

    def _next_pass_first(self, source: CallSource) -> None:
        """Stage 0: the next pass of the rotation. A pass that needs sampled ids still on
        their way gets its batch built first; then, should a call from the executor
        arrive before the ids, this returns, and the stream admits that call, whose
        first pass runs next."""
        call = self.rotation[0]
        if call.passes_run:
            self._advance_batch(call, call.passes_run)
            ids_fd = comm.incoming_fd(self.group.world_size - 1, self.runner.device)
            with self.times.phase("transfer"):
                if not source.wait(ids_fd):
                    return
        self.rotation.pop(0)
        self._forward(call, call.passes_run)
        call.passes_run += 1
        if call.passes_run < call.num_steps:
            self.rotation.append(call)
        else:
            del self.calls[call.batch.virtual_engine]

    def _next_pass(self, source: CallSource) -> None:
        """A later stage: the pass whose header comes next. Should a call from the
        executor arrive before that header, this returns at once, and the stream admits
        that call while the previous stage still works."""
        with self.times.phase("transfer"):
            if not source.wait(comm.incoming_fd(self.group.prev_rank, torch.device("cpu"))):
                return
            head = comm.recv_header(STREAM_HEADER_LEN, self.group.prev_rank, self.group.host_group)
        ve, i = head[HEADER_FIELDS.index("virtual_engine")], head[-1]
        while ve not in self.calls:  # its message is still on the way
            item = source.next_call(True)
            if item is None:
                raise RuntimeError(
                    f"pipeline stage {self.rank} got pass {i} of virtual engine {ve}, for "
                    "which no call was sent"
                )
            self._admit(*item, source)
        call = self.calls[ve]
        if i != call.passes_run:
            raise RuntimeError(
                f"pipeline stage {self.rank} got pass {i} of virtual engine {ve}'s call, "
                f"expected pass {call.passes_run}"
            )
        if not self.last:
            self._forward(call, i, head)
            call.passes_run += 1
            if call.passes_run == call.num_steps:
                del self.calls[ve]
            return
        while any(c is call for c, _, _ in self.pending):  # its previous pass's ids
            self._sample_oldest(source)
        self.pending.append((call, i, self._forward(call, i, head)))
        call.passes_run += 1
        if len(self.pending) > 1:
            self._sample_oldest(source)

    def _sample_stuck(self, source: CallSource) -> None:
        """Last stage, before it waits for a header: sample while every unfinished call
        has a pass waiting to be sampled (stage 0 may be waiting for those ids)."""
        while self.pending and all(
            any(c is call for c, _, _ in self.pending)
            for call in self.calls.values()
            if call.passes_run  # a call counts from its first header on
        ):
            self._sample_oldest(source)

    def _sample_oldest(self, source: CallSource) -> None:
        """Last stage: sample the oldest launched pass; a call's last one sends the
        call's output to the executor."""
        call, i, hidden = self.pending.pop(0)
        self._sample(call, i, hidden)
        if i + 1 == call.num_steps:
            with self.times.phase("sample"):
                output = self._finish(call)
            del self.calls[call.batch.virtual_engine]
            source.reply(call.tag, output)
