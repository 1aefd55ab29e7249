"""The chunked-prefill policy of one virtual engine's scheduler (no torch).

Each step spends a token budget of ``max_num_batched_tokens``:

1. **Decodes first.** Every running group whose prefill is done gets one row per sequence
   (one token each), in running order, up to ``max_num_seqs`` rows. When the cache cannot
   give a group its next slot, the *last* running group (a decode or a partial prefill) is
   preempted by recompute, as without chunking.
2. **Then prefill chunks, oldest first**: first the running groups whose prefill is partly
   done (in admission order), then waiting groups in FIFO order. A chunk gives each
   unfinished sequence of the group the same ``size`` tokens, contiguous with its previous
   chunk: ``size = min(tokens left, budget left // sequences, max_num_batched_tokens //
   max_num_partial_prefills)``. A waiting group is admitted (its whole block table
   allocated at once, as without chunking) only while fewer than
   ``max_num_partial_prefills`` groups are left partly prefilled by this step, the cache
   has room (with the watermark) and ``max_num_seqs`` allows; FIFO: nobody behind the
   first group that does not fit goes first. With prefix caching the first chunk starts
   after the cached tokens, and a chunk's full blocks are registered in the cache when the
   chunk is scheduled (``BlockSpaceManager.mark_computed``).

A group's prompt is sampled only by its last chunk (``do_sample``); until then the group
stays in ``running`` with ``partial_prefill_tokens`` set to the tokens scheduled so far.
An ``n > 1`` request prefills all its sequences together, chunk by chunk (each sequence is
a row), so its siblings need no copy of another sequence's cache. Siblings may differ in
length when such a request is recomputed after speculative decoding accepted different
numbers of tokens for them: chunks then follow the longest, and a shorter sibling's rows
stop at its own end (once its tokens are all in, each later chunk feeds its last token
again, rewriting the same key and value, so the group's last chunk samples every sibling;
vllm/worker/model_input.py).

The step's groups are ordered prefill chunks first, then decode groups (the worker's mixed
batch layout). Decode groups get the configured lookahead slots (``num_scheduler_steps - 1``
with multi-step decoding): a step with a prefill chunk runs one pass, a decode-only step up
to ``num_scheduler_steps`` (the worker decides, see vllm/worker/worker.py). Speculative
decoding runs the target alone in steps with a chunk and speculates in decode-only steps
(vllm/spec_decode/spec_decode_worker.py).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from vllm.core.block_manager import AllocStatus
from vllm.sequence import SequenceGroup, SequenceStatus

# The scheduler imports this module: its classes are named in docstrings, typed Any here.
Scheduler = SchedulerOutputs = Any

_RUNNING = SequenceStatus.RUNNING

logger = logging.getLogger(__name__)


class _Chunks:
    """The prefill chunks of one step and the token budget they share."""

    def __init__(self, sched: Scheduler, used: int):
        cfg = sched.scheduler_config
        self.bm = sched.block_manager
        self.budget = cfg.max_num_batched_tokens
        self.cap = cfg.prefill_chunk_cap
        self.used = used  # tokens of the budget taken so far (decode rows first)
        self.groups: list[SequenceGroup] = []
        self.chunks: list[tuple[int, int]] = []  # (start, size) per group
        self.tokens = 0  # prefill tokens computed
        self.prompt_tokens = 0  # prompt tokens covered, once per request (metrics)
        self.left_partial = 0  # groups this step leaves partly prefilled

    def add(self, group: SequenceGroup, start: int, seqs: list, first: bool = False) -> bool:
        """Schedule the next chunk of ``group`` (its sequences ``seqs``, at ``start``;
        ``first``: its first chunk, which starts after its prefix-cached tokens); False
        when the budget has no room for one token per sequence."""
        n = len(seqs)
        longest = max(s.get_len() for s in seqs)  # siblings may differ (module docstring)
        size = min(longest - start, (self.budget - self.used) // n, self.cap)
        if size < 1:
            return False
        end = start + size
        for seq in seqs:
            self.bm.mark_computed(seq, min(end, seq.get_len()))
        if end < longest:
            group.partial_prefill_tokens = end
            self.left_partial += 1
        else:
            group.partial_prefill_tokens = None
        self.groups.append(group)
        self.chunks.append((start, size))
        self.used += size * n
        self.tokens += size * n
        self.prompt_tokens += end if first else size  # once per request, cached included
        return True


def schedule_chunked(sched: Scheduler, out: SchedulerOutputs) -> SchedulerOutputs:
    """One step of the chunked-prefill policy (see the module docstring) for ``sched``,
    filling ``out`` (empty, with the step's ``num_lookahead_slots``).

    Returns:
        SchedulerOutputs whose first ``num_prefill_groups`` groups are prefill chunks, with
        ``prefill_chunks`` giving each one's (start, size), followed by the decode groups.
    """
    decodes, partial, preempted = _schedule_decodes(sched, out.num_lookahead_slots)
    sched._note_preempted(preempted)
    out.preempted = len(preempted)
    out.num_decode_tokens = sum(g.num_seqs(_RUNNING) for g in decodes)
    chunks = _Chunks(sched, out.num_decode_tokens)
    for i, group in enumerate(partial):  # partial prefills, oldest first
        if not chunks.add(group, group.partial_prefill_tokens, group.get_seqs(_RUNNING)):
            chunks.left_partial += len(partial) - i  # still partial: they bar admissions
            break
    out.ignored_seq_groups = _admit_waiting(sched, chunks)
    out.scheduled_seq_groups = chunks.groups + decodes
    out.num_prefill_groups = len(chunks.groups)
    out.prefill_chunks = chunks.chunks
    out.num_prefill_tokens = chunks.tokens
    out.num_prompt_tokens = chunks.prompt_tokens
    out.num_batched_tokens = chunks.tokens + out.num_decode_tokens
    return out


def _admit_waiting(sched: Scheduler, chunks: _Chunks) -> list[SequenceGroup]:
    """Admit waiting groups in FIFO order while they fit (see the module docstring), each
    with its first chunk; returns the groups finished as ignored."""
    cfg = sched.scheduler_config
    bm = sched.block_manager
    ignored: list[SequenceGroup] = []
    num_seqs = sum(g.get_max_num_running_seqs() for g in sched.running)
    while (head := sched.pop_waiting(ignored)) is not None:
        group, seqs = head
        if (
            chunks.left_partial >= cfg.max_num_partial_prefills
            or chunks.budget - chunks.used < len(seqs)
            or num_seqs + len(seqs) > cfg.max_num_seqs
            or bm.can_allocate(group) != AllocStatus.OK
        ):
            sched.waiting.appendleft(group)  # FIFO: nobody behind it goes first
            break
        bm.allocate(group)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
        # Siblings find the same prompt blocks; after a recompute their outputs differ, and
        # all start at the smallest hit (a longer hit is recomputed with equal values).
        cached = min(bm.get_num_cached_tokens(s) for s in seqs)
        if group.num_cached_tokens is None:  # the first prefill (not a recompute)
            group.num_cached_tokens = cached
        sched.running.append(group)
        num_seqs += len(seqs)
        chunks.add(group, cached, seqs, first=True)
    return ignored


def _schedule_decodes(
    sched: Scheduler, k: int
) -> tuple[list[SequenceGroup], list[SequenceGroup], list[SequenceGroup]]:
    """Give every running decode group its next slot(s), preempting from the back.

    Returns:
        (decode groups scheduled, partial prefills still running in order, preempted).
    """
    max_rows = sched.scheduler_config.max_num_seqs
    num_rows = 0
    pending = deque(g for g in sched.running if not g.is_finished())
    scheduled: list[SequenceGroup] = []
    partial: list[SequenceGroup] = []
    preempted: list[SequenceGroup] = []
    while pending:
        group = pending.popleft()
        if group.is_partial_prefill:
            partial.append(group)
            continue
        seqs = group.get_seqs(_RUNNING)
        if num_rows + len(seqs) > max_rows:
            partial.extend(g for g in pending if g.is_partial_prefill)
            break
        if sched.append_or_preempt(group, seqs, pending, preempted, k, bool(scheduled)):
            scheduled.append(group)
            num_rows += len(seqs)
    return scheduled, partial, preempted
