"""The scheduler of one virtual engine: which requests run in the next step (no torch).

Policy (upstream vLLM V0's default without chunked prefill):

1. **Prefill first.** Waiting requests are admitted in FIFO order while the KV cache (with its
   watermark), the token budget ``max_num_batched_tokens`` and the sequence budget
   ``max_num_seqs`` allow; with prefix caching, a prompt's cached prefix does not count
   against the token budget (it is not computed). A request that can never run -- longer
   than ``max_model_len`` or than the token budget, more sequences than ``max_num_seqs``,
   or more blocks than the cache has -- is finished as FINISHED_IGNORED and reported, so
   it cannot block the queue. A step that admits any prefill runs prefills only.
2. **Otherwise decode** every running request in order. When the cache cannot give a request
   its next slots, the *last* running request is preempted by recompute (blocks freed, its
   sequences back to WAITING with their outputs kept, the request pushed to the front of the
   waiting queue) until the current one fits; a later prefill recomputes prompt + outputs and
   decoding continues from the last token. A request whose recompute could never be
   scheduled (n sequences whose prompts plus outputs exceed ``max_num_batched_tokens``) is
   never the victim: preempting it would cut it short. When it is the one that needs slots
   and an earlier request got its slots in the step, it waits for a later step instead.

With ``enable_chunked_prefill`` the policy is :func:`vllm.core.chunked_prefill.schedule_chunked`
instead: decodes first, then prefill chunks in the rest of the token budget, in one step.
With ``--scheduling-policy priority`` both queues are kept in priority order and a waiting
request may preempt running ones of lower priority first (:mod:`vllm.core.priority`).

The engine owns one Scheduler per virtual engine and talks to it through
:meth:`Scheduler.schedule`, which returns the worker's metadata and a :class:`SchedulerOutputs`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm.core.block_manager import AllocStatus, BlockSpaceManager
from vllm.core.chunked_prefill import schedule_chunked
from vllm.core.priority import order_and_preempt
from vllm.sequence import Sequence, SequenceGroup, SequenceGroupMetadata, SequenceStatus

_RUNNING = SequenceStatus.RUNNING

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutputs:
    """What one :meth:`Scheduler.schedule` call decided.

    Attributes:
        scheduled_seq_groups: the groups to run, in the order of the metadata list.
        num_prefill_groups: how many of them are prefills: the first ones (without chunked
            prefill all of them or 0; with it, prefill chunks first, then decode groups).
        num_batched_tokens: tokens computed this step: prefill tokens plus decode rows.
        num_prefill_tokens / num_decode_tokens: the two parts of ``num_batched_tokens``
            (prompt tokens computed, prefix-cached ones excluded; one per decode row).
        num_prompt_tokens: prompt tokens this step's prefills cover, once per request
            (a whole prompt, or a chunk; a request's first prefill or chunk includes its
            prefix-cached tokens): upstream's ``vllm:prompt_tokens_total`` count.
        prefill_chunks: chunked prefill: per prefill group, (start, size): each of its
            sequences computes tokens ``start .. start + size - 1`` this step; empty when
            every prefill computes its whole sequence.
        ignored_seq_groups: groups finished as FINISHED_IGNORED by this call.
        num_lookahead_slots: KV slots reserved per sequence past its last token (0 on prefill
            steps; the config's value on decode steps).
        running_queue_size: running groups after this call.
        preempted: groups preempted (by recompute) during this call.
    """

    scheduled_seq_groups: list[SequenceGroup] = field(default_factory=list)
    num_prefill_groups: int = 0
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    num_prompt_tokens: int = 0
    num_decode_tokens: int = 0
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    ignored_seq_groups: list[SequenceGroup] = field(default_factory=list)
    num_lookahead_slots: int = 0
    running_queue_size: int = 0
    preempted: int = 0

    def is_empty(self) -> bool:
        """True when nothing runs this step (ignored groups may still need reporting)."""
        return not self.scheduled_seq_groups


class Scheduler:
    """FCFS (or priority) scheduler with recompute preemption for one virtual engine.

    Args:
        scheduler_config: uses ``max_num_seqs``, ``max_num_batched_tokens``,
            ``max_model_len``, ``num_lookahead_slots``, ``enable_chunked_prefill`` and
            ``max_num_partial_prefills``.
        cache_config: uses ``block_size``, ``num_gpu_blocks`` (blocks of this virtual
            engine, known once the KV cache was sized) and ``enable_prefix_caching``.

    Raises:
        ValueError: when ``cache_config.num_gpu_blocks`` is unset or below 1.
    """

    def __init__(self, scheduler_config: Any, cache_config: Any, lora_config: Any = None):
        if cache_config.num_gpu_blocks is None:
            raise ValueError(
                "cache_config.num_gpu_blocks must be set (size the KV cache) before building "
                "the Scheduler, got None."
            )
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.chunked = bool(getattr(scheduler_config, "enable_chunked_prefill", False))
        self.by_priority = getattr(scheduler_config, "policy", "fcfs") == "priority"
        self.block_manager = BlockSpaceManager(
            block_size=cache_config.block_size,
            num_gpu_blocks=cache_config.num_gpu_blocks,
            enable_caching=getattr(cache_config, "enable_prefix_caching", False),
            defer_registration=self.chunked,
        )
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        # Requests that left the queues since the last free_finished_seq_groups() call
        # without passing through it: aborted ones, and waiting groups found finished.
        self._aborted_ids: list[str] = []
        self.num_cumulative_preemption = 0
        # LoRA: adapters the running groups may use at once (None without LoRA)
        self.max_loras = None if lora_config is None else lora_config.max_loras

    # ------------------------------------------------------------------------- queue API
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue a new request (its sequences WAITING) at the back of the waiting queue."""
        self.waiting.append(seq_group)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running)

    def abort_seq_group(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by id: unfinished sequences become FINISHED_ABORTED, every block of
        the group is freed and the group leaves its queue. Unknown ids are ignored."""
        ids = {request_id} if isinstance(request_id, str) else set(request_id)
        if not ids:
            return
        for queue in (self.waiting, self.running):
            for group in [g for g in queue if g.request_id in ids]:
                queue.remove(group)
                for seq in group.get_seqs():
                    if not seq.is_finished():
                        seq.status = SequenceStatus.FINISHED_ABORTED
                    self.free_seq(seq)
                self._aborted_ids.append(group.request_id)

    def undo_failed_prefills(self, out: SchedulerOutputs) -> int:
        """Undo the prefills of ``out``, a step whose model call failed: their blocks leave
        the prefix cache (keys registered when the step was scheduled may never have been
        written, and a later request with the same prefix would read them), and each
        prefill group still running goes back to the front of the waiting queue with its
        blocks freed, as a preemption by recompute does (not counted as one): its next
        schedule prefills it again, instead of decoding after a prompt whose KV was never
        written. Decode groups need nothing (a failed step appends no token, so the next
        schedule runs the same decode). Call it before the step's requests are aborted, if
        they are. Returns how many hashes were dropped."""
        dropped = 0
        prefills = out.scheduled_seq_groups[: out.num_prefill_groups]
        for group in prefills:
            for seq in group.get_seqs():
                dropped += self.block_manager.forget_cached(seq)
        running = {id(g) for g in self.running}
        undo = [g for g in prefills if id(g) in running and not g.is_finished()]
        if undo:
            gone = {id(g) for g in undo}
            self.running = [g for g in self.running if id(g) not in gone]
            for group in reversed(undo):  # the step's first prefill ends first in the queue
                self._preempt(group)
        return dropped

    def free_seq(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks if it holds any (a no-op otherwise)."""
        if self.block_manager.has_table(seq):
            self.block_manager.free(seq)

    def free_finished_seq_groups(self) -> list[str]:
        """Free the blocks of finished sequences and drop finished groups from ``running``.

        One pass over the running groups (O(running sequences); the waiting queue is not
        scanned: only an abort, which removes the group itself, finishes a waiting group in
        the engine; a waiting group finished some other way leaves the queue when
        :meth:`schedule` reaches it).

        Returns:
            ids of the requests that left the scheduler since the previous call: finished
            running groups found now, then requests aborted (or waiting groups found
            finished by :meth:`schedule`) in between.
        """
        finished: list[str] = []
        keep: list[SequenceGroup] = []
        bm = self.block_manager
        for group in self.running:
            done = True
            for seq in group.seqs:
                if seq.is_finished():
                    if bm.has_table(seq):
                        bm.free(seq)
                else:
                    done = False
            if done:
                finished.append(group.request_id)
            else:
                keep.append(group)
        if finished:
            self.running = keep
        finished.extend(self._aborted_ids)
        self._aborted_ids = []
        return finished

    # -------------------------------------------------------------------------- schedule
    def schedule(self) -> tuple[list[SequenceGroupMetadata], SchedulerOutputs]:
        """Decide the next step: prefills if any can be admitted, else decodes (with chunked
        prefill: decodes, then prefill chunks, see :mod:`vllm.core.chunked_prefill`).

        Returns:
            (metadata, outputs): one SequenceGroupMetadata per scheduled group, in the order
            of ``outputs.scheduled_seq_groups``.
        """
        forced: list[SequenceGroup] = []
        if self.by_priority:
            forced = order_and_preempt(self)
            # before admission, which may take a preempted group back into ``running`` in
            # this same step (when the request it was preempted for is passed over)
            self._note_preempted(forced, for_priority=True)
        if self.chunked:
            out = schedule_chunked(
                self,
                SchedulerOutputs(num_lookahead_slots=self.scheduler_config.num_lookahead_slots),
            )
        else:
            out = self._schedule_prefills() if self.waiting else SchedulerOutputs()
            if not out.scheduled_seq_groups:
                ignored = out.ignored_seq_groups
                out = self._schedule_decodes()
                out.ignored_seq_groups = ignored
        out.running_queue_size = len(self.running)
        out.preempted += len(forced)

        now = time.time()
        num_prefills = out.num_prefill_groups
        chunks = out.prefill_chunks
        # The block manager's own tables, not copies: read while this step runs (the VE
        # schedules again only after its step was processed).
        table_of = self.block_manager.live_block_table
        cached_of = self.block_manager.get_num_cached_tokens
        caching = self.block_manager.enable_caching
        metadata = []
        for i, group in enumerate(out.scheduled_seq_groups):
            is_prompt = i < num_prefills
            metrics = group.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
            seqs = group.get_seqs(_RUNNING)
            if len(seqs) == 1:
                seq = seqs[0]
                seq_data = {seq.seq_id: seq.data}
                tables = {seq.seq_id: table_of(seq)}
            else:
                seq_data = {s.seq_id: s.data for s in seqs}
                tables = {s.seq_id: table_of(s) for s in seqs}
            md = SequenceGroupMetadata(
                group.request_id, is_prompt, seq_data, group.sampling_params, tables
            )
            if group.lora_request is not None:
                md.lora_request = group.lora_request
            if is_prompt and chunks:
                start, size = chunks[i]
                md.token_chunk_size = size
                md.do_sample = start + size == max(s.get_len() for s in seqs)
                if start:
                    md.computed_lens = dict.fromkeys(seq_data, start)
            elif is_prompt and caching:
                md.computed_lens = {s.seq_id: cached_of(s) for s in seqs}
            metadata.append(md)
        return metadata, out

    def reset_prefix_cache(self) -> int:
        """Forget this virtual engine's cached prefix blocks (blocks in use stay with their
        sequences). Returns how many cached blocks were forgotten."""
        return self.block_manager.reset_prefix_cache()

    def never_fits_reason(self, seq_lens: list[int], shared_prefix: int = 0) -> str | None:
        """Why a request whose unfinished sequences have ``seq_lens`` tokens can never be
        scheduled, or None if it may be. Reads only the configuration and the cache size,
        so the engine (and the HTTP server, from another thread) can refuse such a request
        before it is queued with the same rule the scheduler applies when it reaches it.

        ``shared_prefix``: tokens every sequence starts with whose KV one prefill can
        share (the prompt, with prefix caching on and no prompt logprobs; else 0).

        Refused when: a sequence is longer than ``max_model_len``; the prefill is longer
        than ``max_num_batched_tokens`` (only without chunked prefill, which splits it over
        steps), counting for every sequence after the first only what it does not share:
        the tokens past the shared prefix's full blocks (at least its last token), as
        :meth:`BlockSpaceManager.group_prefill_tokens` counts them; there are more
        sequences than ``max_num_seqs``; or the prefill needs more blocks than an empty
        cache minus the watermark (``AllocStatus.NEVER``). Lookahead slots are reserved on
        decode steps only, and a request that outgrows the cache while decoding may still
        finish first (EOS, max_tokens), so neither is part of this rule (such a request is
        preempted, then ignored here once its recompute no longer fits).
        """
        cfg = self.scheduler_config
        bm = self.block_manager
        length, n = max(seq_lens), len(seq_lens)
        if length > cfg.max_model_len:
            return f"prompt of {length} tokens is longer than max_model_len={cfg.max_model_len}"
        bs = bm.block_size
        shared = shared_prefix if bm.enable_caching else 0
        tokens = seq_lens[0] + sum(
            n_ - min(shared // bs, (n_ - 1) // bs) * bs for n_ in seq_lens[1:]
        )
        if tokens > cfg.max_num_batched_tokens and not self.chunked:
            return (
                f"prefill of {tokens} tokens ({n} sequences of up to {length} tokens) is "
                f"longer than max_num_batched_tokens={cfg.max_num_batched_tokens}"
            )
        if n > cfg.max_num_seqs:
            return f"{n} sequences are more than max_num_seqs={cfg.max_num_seqs}"
        total = bm.get_num_total_gpu_blocks()
        needed = bm.blocks_needed(seq_lens, shared)
        if total - needed < bm.watermark_blocks:
            return (
                f"prompt of {length} tokens ({n} sequences) needs more KV-cache blocks "
                f"({needed}) than the {total} blocks of {bs} tokens (watermark "
                f"{bm.watermark_blocks} blocks)"
            )
        return None

    def _never_fits(self, group: SequenceGroup) -> str | None:
        """Why the waiting group can never be scheduled (see :meth:`never_fits_reason`)."""
        seq_lens = [s.get_len() for s in group.get_unfinished_seqs()]
        return self.never_fits_reason(seq_lens, group.shared_prompt_len)

    def _schedule_prefills(self) -> SchedulerOutputs:
        cfg = self.scheduler_config
        out = SchedulerOutputs()
        num_seqs = 0
        budget_used = 0  # tokens computed: cached prefixes are not
        for g in self.running:
            num_seqs += g.get_max_num_running_seqs()
        while (head := self.pop_waiting(out.ignored_seq_groups)) is not None:
            group, seqs = head
            tokens = self._tokens_to_compute(group, seqs)
            if (
                self.block_manager.can_allocate(group) != AllocStatus.OK
                or budget_used + tokens > cfg.max_num_batched_tokens
                or num_seqs + len(seqs) > cfg.max_num_seqs
            ):
                # FIFO: nobody behind the first request that does not fit goes first.
                self.waiting.appendleft(group)
                break
            self.block_manager.allocate(group)
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
            if group.num_cached_tokens is None:  # the first prefill (not a recompute)
                group.num_cached_tokens = self.block_manager.get_num_cached_tokens(seqs[0])
            self.running.append(group)
            out.scheduled_seq_groups.append(group)
            computed = sum(s.get_len() - self.block_manager.get_num_cached_tokens(s) for s in seqs)
            budget_used += computed
            out.num_prefill_tokens += computed
            out.num_prompt_tokens += seqs[0].get_len()
            num_seqs += len(seqs)
        out.num_prefill_groups = len(out.scheduled_seq_groups)
        out.num_batched_tokens = out.num_prefill_tokens
        return out

    def append_or_preempt(
        self,
        group: SequenceGroup,
        seqs: list[Sequence],
        pending: deque[SequenceGroup],
        preempted: list[SequenceGroup],
        k: int,
        progress: bool = False,
    ) -> bool:
        """Give ``seqs`` of running ``group`` their next ``k`` + 1 slots, preempting by
        recompute until they fit: the last group of ``pending`` whose recompute could be
        scheduled (:meth:`can_recompute`), else ``group`` itself; each preempted group is
        appended to ``preempted``. True when ``group`` got its slots.

        A group whose recompute could never be scheduled would be cut short (ignored) if
        preempted, so it is passed over; when it is ``group`` and ``progress`` (an earlier
        group got its slots this step) it waits without slots for a later step (False).
        Only when no other choice is left (no progress) is the last pending group, then
        ``group``, preempted all the same, so every step moves some request forward.

        The lookahead stops at position ``max_model_len - 2``, the last one a sequence
        feeds the model: a multi-step call runs at most ``max_model_len - len`` steps and
        a proposal keeps the sequence within ``max_model_len`` (vllm/worker/multi_step.py,
        vllm/spec_decode/ngram_proposer.py), so no slot past it is ever written, and
        reserving one would preempt requests for nothing near the limit."""
        if k:
            longest = max(s.get_len() for s in seqs)
            k = max(0, min(k, self.scheduler_config.max_model_len - 1 - longest))
        while not self.block_manager.try_append_slots(seqs, k):
            victim = next((g for g in reversed(pending) if self.can_recompute(g)), None)
            if victim is not None:
                pending.remove(victim)
            elif self.can_recompute(group):
                victim = group
            elif progress:
                return False
            else:
                victim = pending.pop() if pending else group
            self._preempt(victim)
            preempted.append(victim)
            if victim is group:
                return False
        return True

    def can_recompute(self, group: SequenceGroup) -> bool:
        """Whether ``group``, preempted now, could be scheduled again: its unfinished
        sequences at their current lengths pass :meth:`never_fits_reason`."""
        return self._never_fits(group) is None

    def pop_waiting(
        self, ignored: list[SequenceGroup]
    ) -> tuple[SequenceGroup, list[Sequence]] | None:
        """Pop the first waiting group that could run, with its unfinished sequences; None
        when the queue is empty. On the way, a group that finished while waiting leaves
        (reported as aborted) and one that can never run is finished as FINISHED_IGNORED
        and appended to ``ignored``; a group whose LoRA adapter would exceed ``max_loras``
        adapters among the running groups is passed over (it keeps its place). A caller
        that cannot admit the group puts it back with ``self.waiting.appendleft`` (FIFO:
        nobody behind it goes first)."""
        passed: list[SequenceGroup] = []
        try:
            while self.waiting:
                group = self.waiting.popleft()
                seqs = group.get_unfinished_seqs()
                if not seqs:  # finished while waiting: leaves the queue, reported as it leaves
                    self._aborted_ids.append(group.request_id)
                    continue
                reason = self._never_fits(group)
                if reason is not None:
                    logger.warning("Ignoring request %s: %s.", group.request_id, reason)
                    for seq in seqs:
                        seq.status = SequenceStatus.FINISHED_IGNORED
                    ignored.append(group)
                    continue
                if not self._lora_fits(group):
                    passed.append(group)
                    continue
                return group, seqs
            return None
        finally:
            self.waiting.extendleft(reversed(passed))

    def _lora_fits(self, group: SequenceGroup) -> bool:
        """Whether ``group`` can run beside the running groups without more than
        ``max_loras`` distinct LoRA adapters (upstream V0's rule: a step's adapters must fit
        the device's slots, and every running group decodes in every step)."""
        lora_id = group.lora_int_id
        if not lora_id or self.max_loras is None:
            return True
        running = {g.lora_int_id for g in self.running if g.lora_int_id and not g.is_finished()}
        return lora_id in running or len(running) < self.max_loras

    def _tokens_to_compute(self, group: SequenceGroup, seqs: list[Sequence]) -> int:
        """Prompt tokens the prefill of ``seqs`` would compute if allocated now: what the
        cache and earlier siblings do not share
        (:meth:`BlockSpaceManager.group_prefill_tokens`; every token for a request that
        asks for prompt logprobs, which reads no cache)."""
        if group.sampling_params.prompt_logprobs is not None:
            return sum(s.get_len() for s in seqs)
        return self.block_manager.group_prefill_tokens(
            [s.get_token_ids() for s in seqs], seqs[0].block_hash_keys
        )

    def _schedule_decodes(self) -> SchedulerOutputs:
        cfg = self.scheduler_config
        k = cfg.num_lookahead_slots
        out = SchedulerOutputs(num_lookahead_slots=k)
        scheduled = out.scheduled_seq_groups
        max_rows = cfg.max_num_seqs
        num_rows = 0
        # Finished groups not yet freed stay in `running` but are neither run nor preempted.
        pending = deque(g for g in self.running if not g.is_finished())
        preempted: list[SequenceGroup] = []
        while pending:
            group = pending.popleft()
            seqs = group.get_seqs(_RUNNING)
            rows = len(seqs)
            if num_rows + rows > max_rows:
                break
            # Takes the blocks at once (all of the group's or none), so the next group's
            # check sees what is left.
            if self.append_or_preempt(group, seqs, pending, preempted, k, bool(scheduled)):
                scheduled.append(group)
                num_rows += rows
        out.num_batched_tokens = out.num_decode_tokens = num_rows
        self._note_preempted(preempted)
        out.preempted = len(preempted)
        return out

    def _note_preempted(self, preempted: list[SequenceGroup], for_priority: bool = False) -> None:
        """Drop preempted groups from ``running``, count and log them (why: too few KV-cache
        blocks, or ``for_priority``: waiting requests of higher priority)."""
        if preempted:
            gone = {id(g) for g in preempted}
            self.running = [g for g in self.running if id(g) not in gone]
            self.num_cumulative_preemption += len(preempted)
            bm = self.block_manager
            why = (
                "for waiting requests of higher priority"
                if for_priority
                else f"not enough KV-cache blocks ({bm.get_num_free_gpu_blocks()} free of "
                f"{bm.get_num_total_gpu_blocks()})"
            )
            logger.warning(
                "Preempted %d request(s) by recompute (%s): %s. Total preemptions: %d.",
                len(preempted),
                ", ".join(g.request_id for g in preempted),
                why,
                self.num_cumulative_preemption,
            )

    def _preempt(self, group: SequenceGroup) -> None:
        """Preempt by recompute: free every block, unfinished sequences back to WAITING (their
        output tokens kept), the group at the front of the waiting queue (a partial chunked
        prefill starts over)."""
        group.partial_prefill_tokens = None
        for seq in group.get_seqs():
            self.free_seq(seq)
            if not seq.is_finished():
                seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)
