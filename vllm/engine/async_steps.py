"""The engine-thread half of :class:`~vllm.engine.async_llm_engine.AsyncLLMEngine`: one
virtual engine's step from schedule to outputs and :class:`StepStats`.

Every method here runs on the engine thread (the one thread that calls the LLMEngine).

Async output processing (``ModelConfig.use_async_output_proc``, on by default with one
CUDA device; vllm/engine/step_report.py). :meth:`EngineSteps.whole_step` applies step N's
samples (tokens appended, stop conditions, finished requests freed) and takes its token
times before it returns, and holds the rest of step N (texts, RequestOutputs) in the
engine as a report. Step N+1 hands that report to the worker as the request's
``async_callback``: the worker runs it once step N+1's device work is launched, and the
callback passes step N's outputs to ``deliver`` there, so the request streams get them
while the device computes. The outputs and the order in which each stream gets them are
the same as without the mode; only the host work moves. A step that gives some request
its first token is finished at once instead: holding it would add the next step's host
work (an eager prefill's launch, or a multi-step call's preparation) to that request's
time to first token.

A held report is delivered by the next ``whole_step`` of its VE, also when the VE has
nothing left to schedule (``LLMEngine.has_work`` stays True until then), and by
:meth:`EngineSteps.flush` before every request is aborted and when the loop stops. An
abort of one request drops it from the held report (``LLMEngine.abort_request``): its
client has gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.engine.llm_engine import LLMEngine
from vllm.engine.metrics import StepStats
from vllm.engine.request_metrics import FinishedRequest
from vllm.outputs import PoolingRequestOutput, RequestOutput

logger = logging.getLogger(__name__)

# (outputs, {request_id: error} for the failed ones, the step's statistics)
StepResult = tuple[list[RequestOutput], dict[str, Exception], StepStats]


@dataclass
class ScheduledStep:
    """A scheduled step of one VE, with what the statistics need from before its samples
    are applied: the requests still without a first token, and each other request's last
    token time (seconds since the epoch)."""

    request: object
    sched_out: object
    no_first_token: set[str] = field(default_factory=set)
    last_token_time: dict[str, float] = field(default_factory=dict)
    output_lens: dict[str, int] = field(default_factory=dict)  # tokens generated before it


@dataclass
class _StepTimes:
    """What a step adds to the statistics besides its outputs: tokens sampled, and TTFT /
    TPOT observations in seconds (taken when its samples are applied, so a request
    aborted before its report is delivered still counts)."""

    generated: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)


class EngineSteps:
    """Steps of an :class:`LLMEngine` for the async engine (see the module doc).

    Args:
        engine: the engine (called from the engine thread only).
        deliver: called on the engine thread with a held step's :data:`StepResult`; it must
            hand the result to the event loop itself (``loop.call_soon_threadsafe``).

    Raises:
        ValueError: async output processing with more than one virtual engine.
    """

    def __init__(self, engine: LLMEngine, deliver: Callable[..., None]):
        self.engine = engine
        self.deliver = deliver
        self.async_proc = engine.model_config.use_async_output_proc
        if self.async_proc and len(engine.schedulers) != 1:
            raise ValueError(
                f"async output processing needs one virtual engine, got {len(engine.schedulers)}."
            )
        self._spec_collected = 0.0
        # Per VE with a held report (``LLMEngine.hold_report``): its schedule and times.
        self._held: dict[int, tuple[ScheduledStep, _StepTimes]] = {}
        self._callback_error: BaseException | None = None

    # ------------------------------------------------------------------ whole steps
    def whole_step(self, ve: int) -> StepResult | None:
        """Schedule, execute and process one step of ``ve``.

        Returns the step's result, or None when the step's report is held (async output
        processing: its result goes to ``deliver`` during the next step of ``ve``). A step
        that gave a request its first token is not held: its outputs are made at once, so
        time to first token does not wait for the next step's launch. A step
        whose model call raised fails its scheduled requests (:meth:`fail_step`), after
        the held report of the step before it is delivered.

        Raises:
            Exception: whatever delivering the held report raised (a defect of the
                engine, not of the model call; the async engine then stops).
        """
        engine = self.engine
        sched = self.schedule(ve)
        callback = self._held_callback(ve)
        if callback is not None:
            sched.request.async_callback = callback
        try:
            output = None
            if sched.request.seq_group_metadata_list:
                output = engine.executor.execute_model(sched.request)
        except Exception as e:
            if self._callback_error is not None:
                err, self._callback_error = self._callback_error, None
                raise err from e
            gone = self._release(ve, callback)
            return self.fail_step(ve, sched, e, gone)
        gone = self._release(ve, callback)
        report = engine.apply_outputs(ve, sched.sched_out, output, gone)
        times = self._times(sched, output, gone)
        if self.async_proc and output is not None and not times.ttft:
            engine.hold_report(ve, report)
            self._held[ve] = (sched, times)
            return None
        outs = engine.finish_report(ve, report)[0]
        return self._result(sched, outs, times)

    def flush(self) -> None:
        """Deliver every held report now (before every request is aborted, and when the
        loop stops)."""
        for ve in list(self._held):
            self._release(ve, self._held_callback(ve))

    def _held_callback(self, ve: int):
        """Take ``ve``'s held report; returns a callback that delivers it once (None
        without one), with the report as its ``report`` attribute. The callback keeps an
        exception for :meth:`_release` rather than raising it into the worker's call,
        where it would pass for a failed model call."""
        report = self.engine.take_report(ve)
        if report is None:
            return None
        sched, times = self._held.pop(ve)
        done = [False]

        def deliver_once() -> None:
            if done[0]:
                return
            done[0] = True
            try:
                self.deliver(*self._result(sched, report.finish(), times))
            except BaseException as e:
                self._callback_error = e

        deliver_once.report = report
        return deliver_once

    def _release(self, ve: int, callback) -> set[str]:
        """Deliver a taken report (unless the worker has) and free the requests whose
        text failed in it; returns their ids (``LLMEngine.finish_report``).

        Raises:
            Exception: what the delivery raised.
        """
        if callback is None:
            return set()
        callback()
        if self._callback_error is not None:
            err, self._callback_error = self._callback_error, None
            raise err
        return self.engine.finish_report(ve, callback.report)[1]

    # ------------------------------------------------------------------ step pieces
    def schedule(self, ve: int) -> ScheduledStep:
        """Schedule a step of ``ve`` (``LLMEngine.schedule_step``) and note what the
        statistics need from before it runs."""
        request, sched_out = self.engine.schedule_step(ve)
        s = ScheduledStep(request, sched_out)
        for g in sched_out.scheduled_seq_groups:
            s.output_lens[g.request_id] = sum(seq.get_generated_len() for seq in g.seqs)
            if g.metrics.first_token_time is None:
                s.no_first_token.add(g.request_id)
            elif g.metrics.last_token_time is not None:
                s.last_token_time[g.request_id] = g.metrics.last_token_time
        return s

    def process(self, ve: int, sched: ScheduledStep, output) -> StepResult:
        """Process a step's output (None: nothing ran) at once: its outputs, failures and
        statistics."""
        outs = self.engine.process_outputs(ve, sched.sched_out, output)
        return self._result(sched, outs, self._times(sched, output, set()))

    def fail_step(
        self, ve: int, sched: ScheduledStep, err: Exception, gone: set[str] = frozenset()
    ) -> StepResult:
        """Fail every request scheduled in a step whose model call raised ``err``, except
        ``gone`` (failed and reported already, by the report of the step before)."""
        # Runs outside the except block that caught ``err`` (on a VE thread or in the
        # executor, possibly), so the traceback is passed explicitly.
        logger.error("Step of virtual engine %d failed; failing its requests.", ve, exc_info=err)
        self.engine.undo_failed_steps([(ve, sched.sched_out)])
        ids = [g.request_id for g in sched.sched_out.scheduled_seq_groups]
        ids = [rid for rid in ids if rid not in gone]
        self.engine.abort_request(ids)
        report = self.engine.apply_outputs(ve, sched.sched_out, None, gone)
        outs = self.engine.finish_report(ve, report)[0]
        return outs, dict.fromkeys(ids, err), self.stats(sched, outs, _StepTimes())

    def _result(self, sched: ScheduledStep, outs: list[RequestOutput], times: _StepTimes):
        failed = {}
        for out in outs:
            err = self.engine.failed_requests.pop(out.request_id, None)
            if err is not None:
                failed[out.request_id] = err
        return outs, failed, self.stats(sched, outs, times)

    @staticmethod
    def _times(sched: ScheduledStep, output, gone: set[str]) -> _StepTimes:
        """A step's :class:`_StepTimes`, right after its samples were applied. Requests in
        ``gone`` add nothing: their samples were dropped. ``output.outputs`` (None: nothing
        ran) is aligned with the scheduled groups; a multi-token step, speculative or
        multi-step, counts each token appended (not those sampled past a stop)."""
        times = _StepTimes()
        groups = sched.sched_out.scheduled_seq_groups
        outs = output.outputs if output is not None else [None] * len(groups)
        for g, out in zip(groups, outs):
            rid, m = g.request_id, g.metrics
            if rid in gone:
                continue
            if out is not None and g.pooling_params is None:  # (embeddings generate nothing)
                # tokens appended: a stop drops a multi-token step's rest (the tokens a stop
                # string cuts off were generated, by this step or an earlier one: counted)
                generated = sum(s.get_generated_len() for s in g.seqs)
                times.generated += generated - sched.output_lens[rid]
            if rid in sched.no_first_token and m.first_token_time is not None:
                times.ttft.append(m.first_token_time - m.arrival_time)
            prev = sched.last_token_time.get(rid)
            if prev is not None and m.last_token_time is not None and m.last_token_time > prev:
                times.tpot.append(m.last_token_time - prev)
        return times

    # ------------------------------------------------------------------ statistics
    def gauges(self) -> StepStats:
        """Running / waiting requests and KV-cache usage now."""
        spec = None
        now = time.monotonic()
        # Spec-decode counters are collected at an interval (1 s), not every step, and not
        # from a failed executor: its ranks no longer answer, and a step failed by it must
        # still fail its own requests (the loop then stops on the failed executor).
        failed = getattr(self.engine.executor, "failed", False)
        if now - self._spec_collected >= 1.0 and not failed:
            self._spec_collected = now
            get = getattr(self.engine, "spec_decode_metrics", None)
            spec = get() if get is not None else None
        return StepStats(**self.engine.scheduler_gauges(), spec_decode=spec, **self._lora_names())

    def _lora_names(self) -> dict:
        """StepStats' ``lora_running`` / ``lora_waiting``: sorted adapter names (nothing
        without LoRA)."""
        if self.engine.config.lora_config is None:
            return {}

        def names(groups) -> tuple[str, ...]:
            return tuple(sorted({g.lora_request.lora_name for g in groups if g.lora_request}))

        schedulers = self.engine.schedulers
        return dict(
            lora_running=names(g for s in schedulers for g in s.running if not g.is_finished()),
            lora_waiting=names(g for s in schedulers for g in s.waiting),
        )

    def stats(self, sched: ScheduledStep, outs: list[RequestOutput], times: _StepTimes):
        """A step's :class:`StepStats`: the gauges now, its prompt tokens, its
        :class:`_StepTimes`, and the requests that finished in its outputs."""
        stats = self.gauges()
        stats.prompt_tokens = sched.sched_out.num_prompt_tokens
        stats.generation_tokens = times.generated
        stats.ttft, stats.tpot = list(times.ttft), list(times.tpot)
        finished = [out for out in outs if out.finished]
        groups = {}
        if finished:  # most steps finish nothing: no per-step map of the batch
            groups = {g.request_id: g for g in sched.sched_out.scheduled_seq_groups}
        now = time.time()
        for out in finished:
            group = groups.get(out.request_id)
            if group is not None:
                if isinstance(out, PoolingRequestOutput):
                    reasons = ["stop" if out.outputs.data is not None else "abort"]
                else:  # one per sequence: n = 2 may end with "stop" and "length"
                    reasons = [o.finish_reason or "abort" for o in out.outputs] or ["abort"]
                stats.finished.append(FinishedRequest.from_group(group, reasons, now))
        try:
            stats.decode_steps = self.engine.decode_step_counters()
        except Exception:
            stats.decode_steps = None
        return stats
