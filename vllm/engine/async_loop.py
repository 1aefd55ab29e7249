"""The background loop of :class:`~vllm.engine.async_llm_engine.AsyncLLMEngine`.

Threads. The engine is synchronous and not thread-safe, so every LLMEngine call (building
it, add/abort, schedule, process outputs, shutdown) runs on ONE dedicated "engine thread".
The asyncio event loop never blocks on a step, so HTTP requests are accepted and tokens
stream while the model runs.

Virtual engines. The loop keeps at most one step in flight per virtual engine (VE): when VE
v is idle and its scheduler has work, a step of v starts. With one VE, admitting new
requests and the whole step (schedule -> execute -> process) are one call on the engine
thread; with async output processing (one CUDA device, the default) a step's texts and
outputs are made and streamed during the next step's model call instead
(vllm/engine/async_steps.py). With several VEs (pipeline parallel) only scheduling and
output processing run on the engine thread; the model call runs through
``executor.execute_model_async`` when the executor has it, else on a per-VE thread, so VE
0's step can run while VE 1's is scheduled or processed.
Model calls of different VEs on ONE device never overlap: the single-process executor
serialises them with a lock (vllm/executor/uniproc_executor.py says why), and each stage
of the mp and Ray executors runs its steps one at a time.

Failures. An exception while one request's output is processed fails that request only
(``LLMEngine.failed_requests``); its stream raises :class:`RequestFailedError` and the loop
goes on. An exception in a whole step fails the requests scheduled in it. Anything else
that escapes the loop marks the engine dead (``errored``) and fails every open stream; so
does a failed executor (a pipeline worker process died), which the loop checks after every
step and at least once a second while idle. ``on_dead`` (set by the HTTP server) is then
called once with the error, so the server can exit and be restarted by its supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from vllm.engine.request_metrics import FinishedRequest

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The background loop stopped (crash or shutdown); no request can be served."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine; the engine itself is still healthy."""


class EngineLoop:
    """The loop half of AsyncLLMEngine (a mixin; the module docstring says how it runs).

    It uses the state AsyncLLMEngine.__init__ sets: ``engine`` (the LLMEngine), ``steps``
    (EngineSteps), ``metrics``, the engine thread ``_thread`` and the per-VE threads
    ``_ve_threads``, the request ``_streams`` (id -> asyncio.Queue), the ``_pending``
    requests and ``_aborts`` the event loop queued, ``_wakeup`` (asyncio.Event),
    ``_loop``, ``_stopping``, ``_fatal_error``, ``errored``, ``on_dead`` and
    ``num_virtual_engines``.
    """

    def _check_executor(self) -> None:
        executor = self.engine.executor
        if getattr(executor, "failed", False):
            err = getattr(executor, "_error", None)
            raise EngineDeadError(f"the executor failed: {err}")

    async def _on_engine(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _run_loop(self) -> None:
        in_flight: dict[int, asyncio.Task] = {}
        try:
            while True:
                self._raise_fatal()
                self._wakeup.clear()
                pending, self._pending = self._pending, []
                aborts, self._aborts = self._aborts, []
                idle = [v for v in range(self.num_virtual_engines) if v not in in_flight]
                self._check_executor()
                ready, replies, gauges, ran, stepped = await self._on_engine(
                    self._admit_and_step, pending, aborts, idle
                )
                if not ran or gauges.finished:  # a step's stats carry newer gauges
                    self.metrics.record(gauges)
                for rid, reply in replies:  # a refusal's error, or an abort's final output
                    self._deliver(rid, reply)
                self._raise_fatal()  # e.g. a held step's delivery failed
                if ran:
                    if stepped is not None:
                        self._deliver_step(*stepped)
                    continue
                if not self._stopping:
                    for v in ready:
                        in_flight[v] = asyncio.create_task(self._step(v))
                if not in_flight:
                    if self._stopping:
                        await self._on_engine(self.steps.flush)  # the last step's outputs
                        self._raise_fatal()
                        return
                    if not self._pending and not self._aborts:
                        # Wake at least once a second to notice a failed executor.
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._wakeup.wait(), 1.0)
                    continue
                wake = asyncio.create_task(self._wakeup.wait())
                await asyncio.wait([*in_flight.values(), wake], return_when="FIRST_COMPLETED")
                wake.cancel()
                for v, task in list(in_flight.items()):
                    if task.done():
                        del in_flight[v]
                        task.result()  # _step handles its errors; anything else is fatal
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                logger.exception("The engine loop died.")
            self.errored = e
            self._fail_all(EngineDeadError(f"the engine loop died: {e!r}"))
            if self.on_dead is not None and not isinstance(e, asyncio.CancelledError):
                self.on_dead(e)
            raise

    def _admit(self, pending, aborts, idle):
        """Engine thread: add new requests, apply aborts, list idle VEs that have work.
        ``replies``: (request id, what its stream gets now): a refused request's error, an
        aborted one's final output."""
        replies = []
        for rid, prompt, params, arrival, priority, lora in pending:
            try:
                self.engine.add_request(
                    rid, prompt, params, arrival, lora_request=lora, priority=priority
                )
            except Exception as e:
                replies.append((rid, e))
        now = time.time()
        gone = [g for g in (self.engine._requests.get(rid) for rid in aborts) if g is not None]
        if aborts:
            self.engine.abort_request(aborts)
        # A stream still open (abort() called by its consumer) ends with the abort output.
        for g in gone:
            replies.append((g.request_id, self.engine.make_request_output(g)))
        ready = [v for v in idle if self.engine.has_work(v)]
        gauges = self.steps.gauges()
        # Aborted requests count as finished with reason "abort" (request_success_total).
        gauges.finished = [FinishedRequest.from_group(g, "abort", now) for g in gone]
        return ready, replies, gauges

    def _admit_and_step(self, pending, aborts, idle):
        """Engine thread: :meth:`_admit`, then with one virtual engine its whole step in the
        same call (``ran``: whether a step ran; ``stepped``: what
        ``EngineSteps.whole_step`` returned, None when its result is held or delivered).

        Why one call: the event loop hands the next step to the engine thread only when it
        gets to the previous call's result, and while it streams the last step's tokens
        that waits behind every stream's chunk; a separate admit call before each step
        added that wait to every step. With several virtual engines the steps run as
        concurrent tasks instead (``ready``)."""
        ready, replies, gauges = self._admit(pending, aborts, idle)
        ran, stepped = False, None
        if self.num_virtual_engines == 1 and ready and not self._stopping:
            ran, stepped = True, self.steps.whole_step(ready[0])
            ready = []
            # The step's statistics may be recorded before these (async output
            # processing): record the gauges as they are after the step.
            finished, gauges = gauges.finished, self.steps.gauges()
            gauges.finished = finished
        return ready, replies, gauges, ran, stepped

    async def _step(self, ve: int) -> None:
        """One step of ``ve`` with several virtual engines: schedule and process on the
        engine thread, the model call beside it (:meth:`_execute`)."""
        steps = self.steps
        sched = await self._on_engine(steps.schedule, ve)
        try:
            output = await self._execute(ve, sched.request)
            outs, failed, stats = await self._on_engine(steps.process, ve, sched, output)
        except Exception as e:
            outs, failed, stats = await self._on_engine(steps.fail_step, ve, sched, e)
        self._deliver_step(outs, failed, stats)

    def _deliver_threadsafe(self, outs, failed, stats) -> None:
        """Engine thread: hand a held step's result to the event loop (async output
        processing, vllm/engine/async_steps.py). An exception while delivering it stops
        the loop, as one while delivering any other step's result does."""

        def deliver() -> None:
            try:
                self._deliver_step(outs, failed, stats)
            except BaseException as e:
                self._fatal(e)

        self._loop.call_soon_threadsafe(deliver)

    def _fatal(self, err: BaseException) -> None:
        """Event loop: make ``err`` stop the engine loop at its next turn (the first
        such error wins)."""
        if self._fatal_error is None:
            self._fatal_error = err
        if self._wakeup is not None:
            self._wakeup.set()

    def _raise_fatal(self) -> None:
        """Event loop: raise the error :meth:`_fatal` stored, if any."""
        if self._fatal_error is not None:
            raise self._fatal_error

    def _deliver_step(self, outs, failed, stats) -> None:
        """Event loop: a step's statistics to the metrics, its outputs (or each failed
        request's error) to the request streams."""
        self.metrics.record(stats)
        for out in outs:
            err = failed.get(out.request_id)
            self._deliver(out.request_id, RequestFailedError(str(err)) if err else out)

    async def _execute(self, ve: int, request):
        if not request.seq_group_metadata_list:
            return None
        executor = self.engine.executor
        if hasattr(executor, "execute_model_async"):
            # a concurrent.futures.Future (resolved by the executor's reader thread)
            return await asyncio.wrap_future(executor.execute_model_async(request))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._ve_threads[ve], executor.execute_model, request)

    def _deliver(self, request_id: str, item) -> None:
        queue = self._streams.get(request_id)
        if queue is not None:
            queue.put_nowait(item)

    def _fail_all(self, err: BaseException) -> None:
        for queue in list(self._streams.values()):
            queue.put_nowait(err)
