"""The engine's step: pick the virtual engines with work, schedule, run the executor, then
append the sampled tokens, detokenize, check stop conditions, free what finished and build
the RequestOutputs. ``LLMEngine`` mixes the methods in.

Three ways to step, chosen when the engine is built (vllm/engine/llm_engine.py): one step
of one virtual engine at a time; pipelined, at most one step in flight per virtual engine
(executors with ``execute_model_async``; the mp executor's stages stream them,
vllm/worker/pp_stream.py); and, for multi-step decoding under pipeline parallelism on
other executors (Ray), rounds of one call per virtual engine whose passes interleave on
every stage (vllm/worker/pp_stage.py). With async output processing a step's outputs are
finished during the next step of the same virtual engine (vllm/engine/step_report.py). The async
engine drives the same pieces (``schedule_step``, ``process_outputs``) from
vllm/engine/async_steps.py.
"""

from __future__ import annotations

import itertools
import logging
import time

from vllm.core.scheduler import SchedulerOutputs
from vllm.engine import output_processor
from vllm.engine.step_report import StepReport
from vllm.engine.token_text import fill_decoded_tokens
from vllm.outputs import DeltaOutputs, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.sequence import (
    ExecuteModelRequest,
    SamplerOutput,
    SequenceGroup,
    SequenceStatus,
)

logger = logging.getLogger(__name__)


class StepMethods:
    """The step; the class it is mixed into provides the schedulers, the executor, the
    request table and the stepping state that ``LLMEngine.__init__`` documents."""

    def step(self) -> list[RequestOutput]:
        """Run one step of the next virtual engine that has work (round robin).

        With a pipelining executor (one exposing ``execute_model_async``) see
        :meth:`_step_pipelined` instead.

        Requests held back for their grammar join first (waiting for one compilation
        only when nothing else can run).

        Returns RequestOutputs of the groups scheduled (and ignored) in this step, or with
        async output processing (``use_async_output_proc``) in the VE's previous step.
        """
        busy = self._in_flight or self._reports
        idle = not busy and not any(s.has_unfinished_seqs() for s in self.schedulers)
        failed = self.admit_compiled(block=idle)
        if self._pp_rounds:
            outs = failed + self._step_round()
        elif self._pipelined:
            outs = failed + self._step_pipelined()
        else:
            outs = failed
            for _ in range(len(self.schedulers)):
                ve = self._next_ve
                self._next_ve = (self._next_ve + 1) % len(self.schedulers)
                if self.has_work(ve):
                    outs = failed + self.step_virtual_engine(ve)
                    break
        if self.stats_log is not None and self.stats_log.due():
            self._log_stats()
        return self._by_output_kind(outs)

    def _by_output_kind(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        """``outs`` as each request's ``SamplingParams.output_kind`` asks, as upstream V0's
        ``step()``: CUMULATIVE everything so far; DELTA only the tokens, text and
        logprobs added since the request's previous output; FINAL_ONLY nothing until the
        finished output."""
        shown = []
        for out in outs:
            rid = out.request_id
            if out.finished:
                delta = self._deltas.pop(rid, None)
                shown.append(out if delta is None else delta.apply(out))
                continue
            group = self._requests.get(rid)
            kind = getattr(group.sampling_params, "output_kind", None) if group else None
            if kind == RequestOutputKind.FINAL_ONLY:
                continue
            if kind == RequestOutputKind.DELTA:
                out = self._deltas.setdefault(rid, DeltaOutputs()).apply(out)
            shown.append(out)
        return shown

    def _log_stats(self) -> None:
        """The periodic stats line (vllm/engine/stats_log.py) with the gauges now."""
        g = self.scheduler_gauges()
        queried, hits = g["prefix_queries"], g["prefix_hits"]
        self.stats_log.log(
            g["num_running"], g["num_waiting"], g["cache_usage"], hits / queried if queried else 0.0
        )

    def scheduler_gauges(self) -> dict:
        """The schedulers' state now, summed over virtual engines (thread: the engine's):
        ``num_running`` / ``num_waiting`` requests, ``cache_usage`` (KV blocks in use, a
        fraction in [0, 1], mean over virtual engines), ``prefix_queries`` /
        ``prefix_hits`` (prompt tokens looked up in / found in the prefix cache since the
        start) and ``preemptions`` (since the start); the names of :class:`StepStats`'
        fields (vllm/engine/metrics.py)."""
        schedulers = self.schedulers
        return dict(
            num_running=sum(s.num_running for s in schedulers),
            num_waiting=sum(s.num_waiting for s in schedulers),
            cache_usage=sum(s.block_manager.usage() for s in schedulers) / len(schedulers),
            prefix_queries=sum(s.block_manager.num_queried_tokens for s in schedulers),
            prefix_hits=sum(s.block_manager.num_hit_tokens for s in schedulers),
            preemptions=sum(s.num_cumulative_preemption for s in schedulers),
        )

    def _step_pipelined(self) -> list[RequestOutput]:
        """Submit a step for every idle virtual engine with work, then wait for the oldest
        step in flight and return its outputs.

        A VE with a step in flight is never scheduled again until that step's samples are
        applied (its sequences have no new token yet), so at most ``num_virtual_engines``
        steps are in flight, and outputs are processed in submission order (hence in
        order per VE). While stage 0 runs VE 1's step, stage 1 runs VE 0's: the pipeline
        stays busy when every VE has work.

        The oldest step's VE is scheduled and submitted again as soon as its samples are
        applied (tokens appended, stop conditions checked, finished requests freed:
        everything its next schedule reads), before its texts and RequestOutputs are made
        (vllm/engine/step_report.py), so the stages wait only for the first half.
        """
        if self._submit_error is not None:  # raised after the previous step's outputs
            err, self._submit_error = self._submit_error, None
            raise err
        results = self._submit_idle()
        if self._in_flight:
            ve, fut, sched_out = self._in_flight.popleft()
            try:
                output = fut.result()
            except BaseException:
                failed = [(ve, sched_out)] + [(v, out) for v, _, out in self._in_flight]
                self._in_flight.clear()
                self.undo_failed_steps(failed)
                raise
            report = self.apply_outputs(ve, sched_out, output)
            try:
                results.extend(self._submit_idle())
            except Exception as e:  # this step's outputs first; the next step() raises it
                self._submit_error = e
            results.extend(self.finish_report(ve, report)[0])
        return results

    def _submit_idle(self) -> list[RequestOutput]:
        """Schedule and submit a step of every virtual engine with work and no step in
        flight, in round-robin order; returns the outputs of those whose schedule ran
        nothing (ignored requests)."""
        results: list[RequestOutput] = []
        busy = {ve for ve, _, _ in self._in_flight}
        for _ in range(len(self.schedulers)):
            ve = self._next_ve
            self._next_ve = (self._next_ve + 1) % len(self.schedulers)
            if ve in busy or not self.schedulers[ve].has_unfinished_seqs():
                continue
            req, sched_out = self.schedule_step(ve)
            if not req.seq_group_metadata_list:
                results.extend(self.process_outputs(ve, sched_out, None))
                continue
            self._in_flight.append((ve, self.executor.execute_model_async(req), sched_out))
            busy.add(ve)
        self.max_steps_in_flight = max(self.max_steps_in_flight, len(self._in_flight))
        return results

    def _step_round(self) -> list[RequestOutput]:
        """Multi-step decoding under PP: schedule every virtual engine with work, submit
        their calls as one round (each stage interleaves the calls' passes, so the
        pipeline holds one VE per stage) and process every call's outputs.
        """
        results: list[RequestOutput] = []
        calls = []
        for ve in range(len(self.schedulers)):
            if not self.schedulers[ve].has_unfinished_seqs():
                continue
            req, sched_out = self.schedule_step(ve)
            if not req.seq_group_metadata_list:
                results.extend(self.process_outputs(ve, sched_out, None))
                continue
            calls.append((ve, req, sched_out))
        if not calls:
            return results
        self.max_steps_in_flight = max(self.max_steps_in_flight, len(calls))
        try:
            outputs = self.executor.execute_model_async([req for _, req, _ in calls]).result()
        except BaseException:
            self.undo_failed_steps([(ve, out) for ve, _, out in calls])
            raise
        for (ve, _, sched_out), output in zip(calls, outputs):
            results.extend(self.process_outputs(ve, sched_out, output))
        return results

    def undo_failed_steps(self, steps: list[tuple[int, SchedulerOutputs]]) -> None:
        """Steps (virtual engine, what it scheduled) whose model call failed: their
        prefills leave the prefix cache and go back to their waiting queue
        (``Scheduler.undo_failed_prefills``), so a caller that goes on stepping gets the
        tokens a step that never failed gives; the async engine and ``LLM.generate``
        abort the failed requests afterwards."""
        for ve, sched_out in steps:
            self.schedulers[ve].undo_failed_prefills(sched_out)

    def schedule_step(self, ve: int) -> tuple[ExecuteModelRequest, SchedulerOutputs]:
        """Schedule one step of virtual engine ``ve`` (with the constrained sequences'
        token bitmasks, see vllm/model_executor/guided_decoding).

        Under PP with multi-step decoding the engine decides a decode call's number of
        passes (``num_steps``, see vllm/worker/multi_step.py ``decode_steps``) so every
        stage runs the same; a call with a constrained sequence runs one pass (its next
        mask needs the grammar matcher).
        """
        metadata, sched_out = self.schedulers[ve].schedule()
        self.guided.attach_masks(metadata)
        num_steps = 1
        guided = any(md.guided_bitmasks for md in metadata)
        if self._pp_multi_step and metadata and not metadata[0].is_prompt and not guided:
            from vllm.worker.multi_step import decode_steps

            sc = self.scheduler_config
            num_steps = decode_steps(metadata, sc.num_scheduler_steps, sc.max_model_len)
        req = ExecuteModelRequest(
            seq_group_metadata_list=metadata,
            virtual_engine=ve,
            num_lookahead_slots=sched_out.num_lookahead_slots,
            running_queue_size=sched_out.running_queue_size,
            num_steps=num_steps,
        )
        return req, sched_out

    def step_virtual_engine(self, ve: int) -> list[RequestOutput]:
        """Schedule, execute and process one step of virtual engine ``ve``.

        With async output processing the previous step's report of ``ve`` is finished while
        this step runs on the device, and its outputs are returned; this step's report
        waits for the next call (vllm/engine/step_report.py).
        """
        req, sched_out = self.schedule_step(ve)
        prev = self.take_report(ve)
        if not req.seq_group_metadata_list:
            done, _ = self.finish_report(ve, prev)
            return done + self.process_outputs(ve, sched_out, None)
        if prev is not None:
            req.async_callback = prev.finish
        try:
            output = self.executor.execute_model(req)
        except BaseException:
            self.undo_failed_steps([(ve, sched_out)])
            if prev is not None:  # a later step returns its outputs
                self.hold_report(ve, prev)
            raise
        done, gone = self.finish_report(ve, prev)  # the worker has normally finished it already
        report = self.apply_outputs(ve, sched_out, output, gone)
        if self.model_config.use_async_output_proc:
            self.hold_report(ve, report)
            return done
        return done + self.finish_report(ve, report)[0]

    def process_outputs(
        self, ve: int, sched_out: SchedulerOutputs, output: SamplerOutput | None
    ) -> list[RequestOutput]:
        """Append sampled tokens, detokenize, apply stop conditions, free finished groups.

        Returns a RequestOutput per scheduled or ignored group, or only for the finished
        ones when :attr:`stream_outputs` is False.
        """
        return self.finish_report(ve, self.apply_outputs(ve, sched_out, output))[0]

    def apply_outputs(
        self,
        ve: int,
        sched_out: SchedulerOutputs,
        output: SamplerOutput | None,
        gone: set[str] = frozenset(),
    ) -> StepReport:
        """The first half of :meth:`process_outputs`: append the sampled tokens, apply the
        stop conditions, free finished groups (in the scheduler and the workers). Texts and
        RequestOutputs are left to the returned report's ``finish()``
        (vllm/engine/step_report.py). ``gone``: ids of requests already reported finished
        and freed (a text that failed in the previous step's report), left out here; so
        are requests aborted while this step ran (steps in flight under PP): the abort
        freed them, and they get no output after it. With ``output`` None (a failed step,
        whose requests the caller has just aborted) every group is reported."""
        now = time.time()
        pending: list[SequenceGroup] = []
        requests = self._requests
        if self.stats_log is not None:
            self.stats_log.add(sched_out.num_prompt_tokens, 0)
        if output is not None:
            process = self._process_group_output
            for group, group_out in zip(sched_out.scheduled_seq_groups, output.outputs):
                if requests.get(group.request_id) is not group:
                    continue  # aborted while its step ran (pipelined): freed, no output
                if self.stats_log is not None:  # the tokens kept (not a stop's rest)
                    len_before = sum(s.get_generated_len() for s in group.seqs)
                try:
                    if process(group, group_out):
                        pending.append(group)
                except Exception as e:  # fail this request only; the step goes on
                    pending.append(group)  # the text of tokens appended before the error
                    self._fail_group(group, e)
                if self.stats_log is not None:
                    kept = sum(s.get_generated_len() for s in group.seqs) - len_before
                    self.stats_log.add(0, kept)
                if group_out.samples:  # a prefill chunk that is not the last samples nothing
                    m = group.metrics
                    m.first_token_time = m.first_token_time or now
                    m.last_token_time = now
        freed: list[int] = []
        reported: list[SequenceGroup] = []
        stream = self.stream_outputs
        for group in itertools.chain(sched_out.ignored_seq_groups, sched_out.scheduled_seq_groups):
            if group.request_id in gone or (
                output is not None and requests.get(group.request_id) is not group
            ):
                continue
            if group.is_finished():
                group.metrics.finished_time = now
                self._requests.pop(group.request_id, None)
                freed.extend(s.seq_id for s in group.seqs)
            elif not stream or group.is_partial_prefill:  # a partial prefill has no news
                continue
            reported.append(group)
        self._free(ve, freed)
        return StepReport(reported, pending, self.tokenizer, stream, self._fail_group)

    def _free(self, ve: int, seq_ids: list[int]) -> None:
        """Free finished sequences in the workers (one call, so one message for
        multi-process executors, per step) and the grammar matchers, then drop finished
        groups from the scheduler."""
        if seq_ids:
            self.executor.free_sequences(seq_ids)
            self.guided.free(seq_ids)
        self.schedulers[ve].free_finished_seq_groups()

    def finish_report(
        self, ve: int, report: StepReport | None
    ) -> tuple[list[RequestOutput], set[str]]:
        """``report.finish()``, then free the requests whose text failed in it (outside the
        worker's call: freeing calls into the executor). Returns the outputs and the ids of
        those requests (already reported finished)."""
        if report is None:
            return [], set()
        outs = report.finish()
        gone = {g.request_id for g in report.failed}
        freed = []
        for group in report.failed:
            if self._requests.pop(group.request_id, None) is not None:
                freed.extend(s.seq_id for s in group.seqs)
        report.failed = []
        if gone:
            self._free(ve, freed)
        return outs, gone

    def _fail_group(self, group: SequenceGroup, err: Exception) -> None:
        """A request whose output processing raised: finished as aborted (and freed with
        its step's other finished requests), the error kept in :attr:`failed_requests`."""
        logger.error("Request %s failed in output processing.", group.request_id, exc_info=err)
        self.failed_requests[group.request_id] = err
        for seq in group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_ABORTED

    def _process_group_output(self, group: SequenceGroup, group_out) -> bool:
        """Append one step's samples of ``group`` (output_processor.append_samples); True
        when its text is left to the step's report. A pooled vector (embedding engines)
        is kept, cut to the request's ``dimensions`` and normalized as it asks
        (vllm/pooling/pooler.py ``finish_vector``)."""
        if group_out.pooled is not None and group.pooling_params is not None:
            from vllm.pooling.pooler import finish_vector

            group.pooled = finish_vector(
                group_out.pooled, group.pooling_params, self.config.pooler_config
            )
        lps = group_out.prompt_logprobs
        if lps is not None:
            if group.sampling_params.detokenize:
                fill_decoded_tokens(self.tokenizer, lps)
            # A prefill from position 0 (entry None) sets them, a later chunk's extend them;
            # a recompute computes none.
            if group.prompt_logprobs is None or (lps and lps[0] is None):
                group.prompt_logprobs = lps
            else:
                group.prompt_logprobs.extend(lps)
        guided = group.sampling_params.guided_decoding is not None
        old_lens = {s.seq_id: s.get_output_len() for s in group.seqs} if guided else None
        # A grammar can end a sequence after its tokens are appended (guided.accept): such
        # a group is detokenized at once, as the grammar's stop keeps its last token's text.
        deferred = output_processor.append_samples(
            group, group_out, self.tokenizer, self.scheduler_config.max_model_len,
            defer_text=not guided,
        )  # fmt: skip
        if guided:
            self.guided.accept(group, old_lens)
        return deferred

    @staticmethod
    def make_request_output(group: SequenceGroup) -> RequestOutput:
        """Snapshot a group as a RequestOutput (see output_processor.py)."""
        return output_processor.make_request_output(group)
