"""The executor interface the engine talks to."""

from __future__ import annotations

import atexit
import logging
import weakref
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any

from vllm.config import EngineConfig
from vllm.sequence import ExecuteModelRequest, SamplerOutput

logger = logging.getLogger(__name__)


class ExecutorBase(ABC):
    """Owns the workers of one engine: starts them, sizes the KV cache, runs steps.

    After construction ``config.cache_config.num_gpu_blocks`` holds the blocks per virtual
    engine (the same on every stage).
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start workers, load the model, size and allocate the KV caches."""

    @abstractmethod
    def execute_model(self, request: ExecuteModelRequest) -> SamplerOutput | None:
        """Run one step and return the last stage's sampler output."""

    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list:
        """Call ``Worker.<method>(*args)`` on every worker; results by rank."""
        raise NotImplementedError

    def free_sequences(self, seq_ids: list[int]) -> None:
        """Drop per-sequence worker state (seeded generators) of finished sequences."""
        return None

    def decode_step_counters(self) -> dict:
        """Counters of graph-replayed and eager decode steps (see vllm/cudagraph/counters.py)."""
        return {}

    def profile(self, start: bool) -> None:
        """Start (``start``) or stop every worker's torch profiler (vllm/worker/profiler.py).

        Raises:
            RuntimeError: VLLM_TORCH_PROFILER_DIR unset, or no profile / one already running.
        """
        raise NotImplementedError

    @abstractmethod
    def startup_summaries(self) -> list[dict]:
        """Each stage's start-up choices (vllm/worker/startup_summary.py), by rank."""

    def shutdown(self) -> None:
        """Stop workers; idempotent."""
        return None


class PipelineExecutorBase(ExecutorBase):
    """An executor whose stages run in other processes (mp) or actors (Ray).

    Subclasses submit each step to every stage in order (``execute_model_async``, a
    future of the last stage's output, so the engine can keep one step in flight per
    virtual engine) and run calls on every stage (``collective_rpc``); ``_error`` holds the
    first stage failure.
    """

    _error: BaseException | None = None

    @abstractmethod
    def execute_model_async(
        self, request: ExecuteModelRequest | list[ExecuteModelRequest]
    ) -> Future:
        """Submit one step (or a round of them, one per virtual engine) to every stage;
        resolves to the last stage's SamplerOutput (their list for a round)."""

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list:
        """Call ``Worker.<method>(*args)`` on every stage; results by rank."""

    def _init_stage_caches(self) -> None:
        """Size the KV cache on every stage, keep the minimum (the same block count per
        virtual engine everywhere), allocate it, then capture each stage's graphs."""
        blocks = self.collective_rpc("determine_num_available_blocks")
        num_blocks = min(blocks)
        logger.info("KV blocks per virtual engine by stage %s -> using %d", blocks, num_blocks)
        check_kv_capacity(self.config, num_blocks)
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.collective_rpc("initialize_cache", num_blocks)
        self.collective_rpc("capture_graphs")

    def execute_model(self, request: ExecuteModelRequest) -> SamplerOutput | None:
        return self.execute_model_async(request).result()

    def startup_summaries(self) -> list[dict]:
        return self.collective_rpc("startup_summary")

    def profile(self, start: bool) -> None:
        self.collective_rpc("start_profile" if start else "stop_profile")

    def spec_decode_metrics(self) -> dict | None:
        """The speculative-decoding counters of TP rank 0, which accepts and records them
        (vllm/spec_decode/metrics.py); None without speculation. A call on every rank
        after the steps already sent (the engine reads them once a second)."""
        if self.config.speculative_config is None:
            return None
        return self.collective_rpc("spec_decode_metrics")[0]

    def decode_step_counters(self) -> dict:
        """Each stage's graph-runner counters (``{}`` for a stage without graphs), by rank."""
        return dict(enumerate(self.collective_rpc("decode_step_counters")))

    @property
    def failed(self) -> bool:
        return self._error is not None

    # ------------------------------------------------------------ shutdown helpers
    def _register_atexit(self) -> None:
        """Shut down at interpreter exit (through a weak reference, so the hook never keeps
        the executor alive); registered before start-up waits, so an interrupted start-up
        still cleans up."""
        self_ref = weakref.ref(self)
        self._atexit = lambda: (lambda ex: ex.shutdown() if ex is not None else None)(self_ref())
        atexit.register(self._atexit)

    def _finish_shutdown(self, pending: list[Future], err: BaseException) -> None:
        """Fail the futures no stage will resolve any more with ``err`` and drop the
        interpreter-exit hook (the last steps of every subclass's ``shutdown``)."""
        for fut in pending:
            if not fut.done():
                fut.set_exception(err)
        if getattr(self, "_atexit", None) is not None:
            atexit.unregister(self._atexit)
            self._atexit = None

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass


def stage_worker_class(config: Any) -> type:
    """The worker class of every rank: ``SpecDecodeWorker`` (the target Worker wrapped with a
    proposer, vllm/spec_decode) when ``config.speculative_config`` is set, else ``Worker``;
    both take ``(config, rank=, local_rank=)``."""
    if config.speculative_config is not None:
        from vllm.spec_decode.spec_decode_worker import SpecDecodeWorker

        return SpecDecodeWorker
    from vllm.worker.worker import Worker

    return Worker


def check_kv_capacity(config: Any, num_blocks: int) -> None:
    """Refuse a KV cache that cannot hold one sequence of ``max_model_len`` tokens (as
    upstream does at start-up): such an engine would accept requests and then end them at
    whatever length the cache allows.

    Args:
        num_blocks: usable blocks per virtual engine (the scratch block excluded).
    Raises:
        ValueError: no block fits, or too few for max_model_len; naming the numbers and
            the settings that change them.
    """
    if num_blocks < 1:
        raise ValueError(
            "No KV-cache blocks fit (after one scratch block per virtual engine): raise "
            "gpu_memory_utilization on CUDA, VLLM_CPU_KVCACHE_SPACE on CPU, "
            "kv_cache_memory_bytes, or num_gpu_blocks_override."
        )
    block_size = config.cache_config.block_size
    capacity = num_blocks * block_size
    max_len = config.model_config.max_model_len
    if max_len > capacity:
        raise ValueError(
            f"max_model_len={max_len} is larger than the {capacity} tokens the KV cache holds "
            f"per virtual engine ({num_blocks} blocks of {block_size}): a sequence of "
            "max_model_len tokens could never run. Lower max_model_len (to at most "
            f"{capacity}) or give the cache more room (gpu_memory_utilization on CUDA, "
            "VLLM_CPU_KVCACHE_SPACE on CPU, kv_cache_memory_bytes, or "
            "num_gpu_blocks_override; with pipeline "
            "parallelism each virtual engine gets its share)."
        )
