"""AsyncLLMEngine: the synchronous LLMEngine driven by a background asyncio loop.

The background loop, its threads and how failures end requests or the engine:
vllm/engine/async_loop.py.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_beam_search import beam_search
from vllm.engine.async_loop import EngineDeadError, EngineLoop, RequestFailedError
from vllm.engine.async_steps import EngineSteps
from vllm.engine.llm_engine import LLMEngine, PromptType
from vllm.engine.metrics import EngineMetrics
from vllm.engine.request_checks import check_priority
from vllm.engine.request_log import log_output, log_request
from vllm.engine.request_metrics import FinishedRequest
from vllm.lora.request import LoRARequest
from vllm.outputs import DeltaOutputs, PoolingRequestOutput, RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

__all__ = ["AsyncLLMEngine", "EngineDeadError", "RequestFailedError"]

logger = logging.getLogger(__name__)


class AsyncLLMEngine(EngineLoop):
    """Asynchronous front of an :class:`LLMEngine` (see the module docstring).

    Use :meth:`from_engine_args`, then ``async for out in engine.generate(...)`` inside a
    running event loop (the background loop starts on first use).

    Args:
        engine_args: arguments of the engine to build (on the engine thread).
        metrics: where step statistics go (a fresh :class:`EngineMetrics` when None).
        log_requests: log each request's prompt and params.
        max_log_len: characters (or token ids, for a prompt without text) of a prompt, and
            of an output with ``log_outputs``, shown in the log (None: all).
        log_outputs: with ``log_requests``, log each request's generated text and token
            ids when it finishes (vllm/engine/request_log.py).
    """

    def __init__(
        self,
        engine_args: EngineArgs,
        metrics: EngineMetrics | None = None,
        log_requests: bool = True,
        max_log_len: int | None = None,
        log_outputs: bool = False,
    ):
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vllm-engine")
        # (the stats line is EngineMetrics'; the LLMEngine's own, for step(), stays off)
        self.engine: LLMEngine = self._thread.submit(
            LLMEngine.from_engine_args, engine_args, log_stats=False
        ).result()
        self.model_config = self.engine.model_config
        self.max_model_len = self.engine.scheduler_config.max_model_len
        # "fcfs" or "priority" (--scheduling-policy): whether requests may carry a priority.
        self.scheduling_policy = self.engine.scheduler_config.policy
        # Structured outputs' engine-wide settings (--structured-outputs-config).
        self.decoding_config = self.engine.config.decoding_config
        # The pooler of an embedding engine (--task embed), None for generation.
        self.pooler_config = self.engine.config.pooler_config
        # SamplingParams field -> default from generation_config.json, for requests that
        # leave the field out (vllm/transformers_utils/generation_config.py).
        self.default_sampling = dict(self.engine.generation_defaults.sampling)
        self.metrics = metrics or EngineMetrics(
            engine_args.model, log_stats=not engine_args.disable_log_stats
        )
        cache = self.engine.config.cache_config
        self.metrics.configure(
            self.max_model_len,
            {
                "block_size": cache.block_size,
                "cache_dtype": cache.cache_dtype,
                "num_gpu_blocks": cache.num_gpu_blocks,
                "gpu_memory_utilization": cache.gpu_memory_utilization,
                "enable_prefix_caching": cache.enable_prefix_caching,
                "num_virtual_engines": len(self.engine.schedulers),
            },
            None
            if self.engine.config.lora_config is None
            else self.engine.config.lora_config.max_loras,
        )
        self.log_requests = log_requests
        self.max_log_len = max_log_len
        self.log_outputs = log_requests and log_outputs
        self.num_virtual_engines = len(self.engine.schedulers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fatal_error: BaseException | None = None
        self.steps = EngineSteps(self.engine, self._deliver_threadsafe)
        self._ve_threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"vllm-ve{v}")
            for v in range(self.num_virtual_engines)
        ]
        # The server tokenizes on the event-loop thread: give it its own copy, so it never
        # shares a Rust tokenizer object with the engine thread's detokenizer.
        tok = self.engine.tokenizer
        try:
            self.tokenizer = copy.deepcopy(tok) if tok is not None else None
        except Exception:
            self.tokenizer = tok
        self._streams: dict[str, asyncio.Queue] = {}
        self._pending: list[tuple] = []  # (id, prompt, params, arrival, priority, lora)
        self._aborts: list[str] = []
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._stopping = False
        # Why abort_all ran (a server's shutdown), else None: a request that only wanted
        # its final output (RequestOutputKind.FINAL_ONLY) and was aborted by it fails with
        # EngineDeadError instead of ending with what it had (see generate).
        self._aborted_all_reason: str | None = None
        self.errored: BaseException | None = None
        # Called once (on the event loop) with the error when the engine dies.
        self.on_dead: Callable[[BaseException], None] | None = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, **kwargs) -> AsyncLLMEngine:
        return cls(engine_args, **kwargs)

    # ----------------------------------------------------------------------- public API
    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def start(self) -> None:
        """Start the background loop in the running event loop (idempotent)."""
        if self._loop_task is None:
            self._wakeup = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._loop_task = self._loop.create_task(self._run_loop())

    async def check_health(self) -> None:
        """Raises EngineDeadError when the background loop has died or the executor failed
        (e.g. a pipeline worker process was killed)."""
        if self.errored is not None:
            raise EngineDeadError(f"the engine loop died: {self.errored!r}")
        self._check_executor()
        if self._stopping:
            raise EngineDeadError("the engine is shutting down.")

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        *,
        dedupe_request_id: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its RequestOutput after every step it is in (all of it
        so far, only what is new, or only the finished output: ``params.output_kind``).

        Leaving the iteration early (client disconnect, cancellation) aborts the request
        and frees its blocks.

        Request ids are unique inside the engine: an id is in use while its stream is open
        or the engine still holds its request (an abort not yet applied). The id is
        claimed before the first suspension point, so two concurrent calls cannot both
        take it. With ``dedupe_request_id`` (the server's ids, which clients may choose
        through ``X-Request-Id``) an id in use gets a suffix, ``<request_id>-<8 hex
        digits>``, and the request runs under that id (its outputs' ``request_id``);
        without it the call is refused.

        Raises:
            EngineDeadError: the engine is dead or shutting down.
            RequestFailedError: the request failed inside the engine.
            ValueError: the engine refused the prompt or params; a ``lora_request`` it
                cannot serve (vllm/lora/registry.py); a non-integer ``priority``, or a
                non-zero one without ``scheduling_policy="priority"`` (lower is served
                first); ``request_id`` in use without ``dedupe_request_id``.
        """
        params = sampling_params
        self.engine.adapters.check(lora_request)
        priority = check_priority(priority, self.scheduling_policy)
        await self.check_health()  # (no suspension point before the id is claimed)
        self.start()
        request_id = self._claim_request_id(request_id, dedupe_request_id)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        queued = finished = False
        kind = params.output_kind
        delta = DeltaOutputs() if kind == RequestOutputKind.DELTA else None
        try:
            await self.prepare_grammar(params)
            await self.check_health()  # the loop may have stopped while the grammar compiled
            if self.log_requests:
                log_request(request_id, prompt, params, lora_request, self.max_log_len)
            self._pending.append((request_id, prompt, params, time.time(), priority, lora_request))
            queued = True
            self._wakeup.set()
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                if finished and self.log_outputs:
                    log_output(item, self.max_log_len)
                if finished and kind == RequestOutputKind.FINAL_ONLY:
                    self._raise_if_aborted_all(item)
                if finished or kind != RequestOutputKind.FINAL_ONLY:
                    yield delta.apply(item) if delta is not None else item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if queued and not finished:
                self._request_abort(request_id)

    def _raise_if_aborted_all(self, out: RequestOutput) -> None:
        """Raise EngineDeadError for a final output that :meth:`abort_all` cut short: a
        caller that waits for the whole result (the server's non-streamed requests) gets
        an error it can retry elsewhere (503) rather than a partial or empty result."""
        reason = self._aborted_all_reason
        if reason is not None and any(o.finish_reason == "abort" for o in out.outputs):
            raise EngineDeadError(f"the request was aborted: {reason}.")

    def _request_id_in_use(self, request_id: str) -> bool:
        """Event loop: an open stream has ``request_id``, or the engine still holds it (a
        dict lookup, safe beside the engine thread)."""
        return request_id in self._streams or self.engine.has_request(request_id)

    def _claim_request_id(self, request_id: str, dedupe: bool) -> str:
        """Event loop: ``request_id`` when free, else with ``dedupe`` a free
        ``<request_id>-<8 hex digits>`` (see :meth:`generate`).

        Raises:
            ValueError: ``request_id`` in use and not ``dedupe``.
        """
        if not self._request_id_in_use(request_id):
            return request_id
        if not dedupe:
            raise ValueError(f"request id {request_id!r} is already running.")
        while True:
            unique = f"{request_id}-{uuid.uuid4().hex[:8]}"
            if not self._request_id_in_use(unique):
                logger.info("Request id %s is in use: running this request as %s.",
                            request_id, unique)  # fmt: skip
                return unique

    def encode(
        self,
        prompt: PromptType,
        pooling_params: PoolingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        *,
        dedupe_request_id: bool = False,
    ) -> AsyncIterator[PoolingRequestOutput]:
        """Queue a pooling request (an engine started with ``task="embed"``) and yield its
        PoolingRequestOutput once pooled; as :meth:`generate` otherwise (request ids and
        ``dedupe_request_id`` too).

        Raises:
            ValueError: a generative engine, or ``dimensions`` the model cannot give (see
                ``LLMEngine.pooling_sampling_params``); as :meth:`generate`.
        """
        self.check_pooling_params(pooling_params)  # its errors before queueing
        return self.generate(
            prompt, pooling_params, request_id, lora_request, priority,
            dedupe_request_id=dedupe_request_id,
        )  # fmt: skip

    def check_pooling_params(self, params: PoolingParams) -> None:
        """Raises ValueError when this engine cannot serve ``params`` (a generative engine,
        or ``dimensions`` the model cannot give)."""
        self.engine.pooling_sampling_params(params)

    async def prepare_grammar(self, params: SamplingParams) -> None:
        """Parse ``params.guided_decoding`` (on the engine thread, which owns the grammar
        cache) and wait for its compilation (on the cache's threads), so the request's
        ``add_request`` finds the grammar ready and no step waits for it. No-op without
        a constraint.

        Raises:
            ValueError: the constraint does not parse or compile (the message names it).
        """
        if params.guided_decoding is None:
            return
        fut = await self._on_engine(self.engine.guided.grammar_future, params)
        try:
            await asyncio.wrap_future(fut)
        except Exception as e:
            kind = params.guided_decoding.kind
            raise ValueError(f"invalid guided {kind}: could not compile it ({e}).") from e

    def beam_search(
        self,
        prompt: dict,
        params: BeamSearchParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        *,
        dedupe_request_id: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Beam search (vllm/engine/async_beam_search.py): yields one finished RequestOutput
        whose ``outputs`` are the ``params.beam_width`` best sequences, best first; every
        beam runs with ``lora_request``'s adapter when one is given. Each step's requests
        claim their ids as :meth:`generate` does (``dedupe_request_id`` too)."""
        return beam_search(self, prompt, params, request_id, lora_request, dedupe_request_id)

    def check_schedulable(
        self, prompt_len: int, n: int, reads_cache: bool = True, max_tokens: int | None = None
    ) -> None:
        """Raises ValueError for a request the scheduler could never run (see
        :meth:`LLMEngine.check_schedulable`; safe to call from the event loop)."""
        self.engine.check_schedulable(prompt_len, n, reads_cache, max_tokens)

    def verify_params(self, params) -> None:
        """Raises ValueError for params the model cannot serve (logprobs above
        ``max_logprobs`` or the vocabulary, out-of-vocabulary token ids; see
        :meth:`LLMEngine.verify_params`; reads only configuration, so safe to call from the
        event loop)."""
        self.engine.verify_params(params)

    @property
    def num_open_requests(self) -> int:
        """Requests whose output stream is still open (queued, running or being read)."""
        return len(self._streams)

    async def abort_all(self, reason: str) -> int:
        """Abort every queued and running request; each open stream gets a final output
        whose sequences finish with finish_reason "abort" (used when a graceful shutdown
        runs out of time), except a request that asked only for its final output
        (``RequestOutputKind.FINAL_ONLY``, the server's non-streamed requests): that one
        fails with EngineDeadError naming ``reason``. Returns how many requests were
        aborted.

        Cancelling the call does not cancel the abort: once it has reached the engine
        thread, its outputs are still delivered. An error there (the held step's report
        may be lost with it) stops the loop, as a failed delivery does."""
        self._aborted_all_reason = reason
        pending, self._pending = self._pending, []
        for rid, *_ in pending:
            self._deliver(rid, EngineDeadError(reason))
        task = asyncio.ensure_future(self._on_engine(self._abort_all))
        task.add_done_callback(lambda t: self._aborted_all(t, len(pending), reason))
        outs, _ = await asyncio.shield(task)
        return len(outs) + len(pending)

    def _aborted_all(self, task: asyncio.Future, num_pending: int, reason: str) -> None:
        """Event loop: deliver :meth:`_abort_all`'s outputs, or stop the loop with its
        error."""
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            self._fatal(err)
            return
        outs, stats = task.result()
        self.metrics.record(stats)
        for out in outs:
            self._deliver(out.request_id, out)
        if outs or num_pending:
            logger.warning("Aborted %d request(s): %s", len(outs) + num_pending, reason)

    def _abort_all(self):
        """Engine thread: abort every request and snapshot each as a finished output
        (after the held step's outputs are delivered, so the snapshots' texts are made)."""
        self.steps.flush()
        groups = list(self.engine._requests.values())
        self.engine.abort_request([g.request_id for g in groups])
        outs = [self.engine.make_request_output(g) for g in groups]
        stats = self.steps.gauges()
        now = time.time()
        stats.finished = [FinishedRequest.from_group(g, "abort", now) for g in groups]
        return outs, stats

    async def abort(self, request_id: str) -> None:
        """Abort a request (applied on the engine thread before the next step); its stream
        then ends with a final output whose finish_reason is "abort" (as upstream's V1).
        Unknown or finished ids are ignored."""
        self._request_abort(request_id)

    def _request_abort(self, request_id: str) -> None:
        if self._wakeup is None:
            return
        self._aborts.append(request_id)
        self._wakeup.set()
        if self.log_requests:
            logger.info("Aborted request %s.", request_id)

    async def get_tokenizer(self):
        """The server-side copy of the tokenizer (see ``tokenizer``)."""
        return self.tokenizer

    async def get_model_config(self):
        """The engine's ModelConfig."""
        return self.model_config

    async def get_vllm_config(self):
        """The engine's whole EngineConfig (upstream's VllmConfig)."""
        return self.engine.config

    @property
    def dead_error(self) -> BaseException:
        """The error that killed the engine loop (an EngineDeadError when none did)."""
        return self.errored or EngineDeadError("the engine is not running.")

    async def shutdown(self) -> None:
        """Stop the loop after the steps in flight, fail open streams, stop the workers."""
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._loop_task is not None:
            try:
                await self._loop_task
            except Exception:
                pass
        self._fail_all(EngineDeadError("the server is shutting down."))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self.engine.shutdown)
        self._thread.shutdown(wait=True)
        for t in self._ve_threads:
            t.shutdown(wait=True)

    async def start_profile(self) -> None:
        """:meth:`LLMEngine.start_profile` on the engine thread (between steps)."""
        await self._on_engine(self.engine.start_profile)

    async def stop_profile(self) -> None:
        """:meth:`LLMEngine.stop_profile` on the engine thread (writes the traces)."""
        await self._on_engine(self.engine.stop_profile)

    async def reset_prefix_cache(self) -> bool:
        """:meth:`LLMEngine.reset_prefix_cache` on the engine thread (between schedules)."""
        return await self._on_engine(self.engine.reset_prefix_cache)

    async def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """:meth:`LLMEngine.collective_rpc` (vllm/engine/rpc_api.py) on the engine thread,
        between steps: ``method`` on every worker rank, the results by rank."""
        return await self._on_engine(self.engine.collective_rpc, method, timeout, args, kwargs)
