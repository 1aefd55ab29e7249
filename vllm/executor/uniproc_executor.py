"""The executor for one device in the engine's own process.

One worker, one step at a time. With several virtual engines the async engine calls
:meth:`UniProcExecutor.execute_model` from one thread per virtual engine, but the single
Worker / ModelRunner is not safe to enter twice: its attention backend keeps shared eager
state (FlashInfer's prefill and decode wrappers are planned in input preparation and run in
the forward, so a second VE planning in between makes the first run the other's plan), and
the sampler's generator store, the step counters and the staging buffers are shared too.
So every call into the worker (steps, freeing sequences) holds one lock: steps of
different VEs on one device run one after the other, never overlapped. (Multi-process and
Ray stages run their steps one by one in arrival order already.)
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from vllm.executor.executor_base import ExecutorBase, check_kv_capacity, stage_worker_class
from vllm.sequence import ExecuteModelRequest, SamplerOutput
from vllm.worker.worker_process import run_call

logger = logging.getLogger(__name__)


class UniProcExecutor(ExecutorBase):
    """Runs a single worker in-process (world size 1): a :class:`~vllm.worker.worker.Worker`,
    or the speculative-decoding worker (``stage_worker_class``)."""

    def _init_executor(self) -> None:
        self._lock = threading.Lock()  # serialises every call into the worker (see above)
        self.worker = stage_worker_class(self.config)(self.config)
        self.worker.init_device()
        self.worker.load_model()
        num_blocks = self.worker.determine_num_available_blocks()
        check_kv_capacity(self.config, num_blocks)
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.worker.initialize_cache(num_blocks)
        self.worker.capture_graphs()

    def execute_model(self, request: ExecuteModelRequest) -> SamplerOutput | None:
        """Run one step of ``request.virtual_engine``; blocks while another VE's step runs."""
        with self._lock:
            return self.worker.execute_model(request)

    def free_sequences(self, seq_ids: list[int]) -> None:
        with self._lock:
            self.worker.free_sequences(seq_ids)

    def spec_decode_metrics(self) -> dict | None:
        """The SpecDecodeWorker's counters (vllm/spec_decode/metrics.py), None without one."""
        worker = self.__dict__.get("worker")
        return None if worker is None else run_call(worker, "spec_decode_metrics", ())

    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list:
        """``[Worker.<method>(*args)]`` (or the helper of that name, see ``run_call`` in
        vllm/worker/worker_process.py), between steps (``timeout`` unused: in process)."""
        with self._lock:
            return [run_call(self.worker, method, args)]

    def profile(self, start: bool) -> None:
        with self._lock:
            (self.worker.start_profile if start else self.worker.stop_profile)()

    def startup_summaries(self) -> list[dict]:
        from vllm.worker.startup_summary import stage_summary

        return [stage_summary(self.worker)]

    def decode_step_counters(self) -> dict:
        if "worker" not in self.__dict__:
            return {}
        return self.worker.model_runner.counters.snapshot()

    def shutdown(self) -> None:
        """Release the worker (model, KV caches, CUDA graphs) and return cached device
        memory to the driver, so another engine can start in this process."""
        worker = self.__dict__.pop("worker", None)
        if worker is None:
            return
        device = worker.device
        del worker
        import gc

        gc.collect()
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
