"""The Ray actor that hosts one pipeline stage (used by :mod:`vllm.executor.ray_executor`).

This module does not import Ray: the executor wraps :class:`RayStageWorker` with
``ray.remote(num_gpus=1 | num_cpus=1)`` at run time. The stage itself is the same code the
mp executor runs in its processes (:func:`vllm.worker.worker_process.setup_stage_worker`,
``run_call``, ``teardown_stage_worker``); only the transport differs: Ray actor method calls
instead of a pipe. Calls from one caller run one at a time, in submission order, so every
stage sees the steps in the same order (what :mod:`vllm.distributed.communication` needs);
only :meth:`RayStageWorker.watch` runs in a concurrency group of its own.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from vllm.sequence import ExecuteModelRequest, SamplerOutput
from vllm.worker.request_delta import StageRequestCache


class RayStageWorker:
    """One pipeline stage inside a Ray actor.

    Life: ``node_info()`` (where the actor landed) -> ``free_port()`` on rank 0 (the
    rendezvous port) -> ``setup(config, rank, init_method)`` on every actor at once (the
    group forms only when all ranks join) -> ``execute_model`` / ``call`` / ``free_sequences``
    -> ``teardown()``.
    """

    def __init__(self) -> None:
        self.worker = None
        self.rank: int | None = None
        self.is_last = False
        self.cache = StageRequestCache()  # decode steps arrive as deltas
        self._torn_down = threading.Event()

    def node_info(self) -> dict[str, Any]:
        """Where this actor runs: node id and IP, pid, placement group id (None if none),
        the GPU ids Ray assigned (CUDA_VISIBLE_DEVICES is set to them)."""
        import ray
        from ray.util import get_current_placement_group

        ctx = ray.get_runtime_context()
        pg = get_current_placement_group()
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "placement_group_id": pg.id.hex() if pg is not None else None,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self, host: str) -> int:
        """A TCP port free on this actor's node right now (rank 0 hosts the rendezvous)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def setup(self, config, rank: int, init_method: str, worker_cls=None) -> int:
        """Build the Worker of stage ``rank``, join the group, load the layers.

        ``local_rank`` is 0: Ray narrows CUDA_VISIBLE_DEVICES to this actor's one GPU;
        ``worker_cls`` as in ``setup_stage_worker``. Returns this process's pid.
        """
        from vllm.worker.worker_process import setup_stage_worker

        self.rank = rank
        self.is_last = rank == config.parallel_config.sampling_rank  # TP rank 0, last stage
        self.worker = setup_stage_worker(config, rank, 0, init_method, worker_cls)
        return os.getpid()

    def execute_model(
        self, request: ExecuteModelRequest | list[ExecuteModelRequest]
    ) -> SamplerOutput | list[SamplerOutput] | None:
        """Run one step (or a round, a list); the sampling rank (TP rank 0 of the last
        stage) returns the SamplerOutput (their list), the others None."""
        out = self.worker.execute_model(self.cache.expand(request))
        return out if self.is_last else None

    def call(self, method: str, args: tuple) -> Any:
        """A Worker method or a worker_process helper (see ``run_call``)."""
        from vllm.worker.worker_process import run_call

        return run_call(self.worker, method, args)

    def free_sequences(self, seq_ids: list[int]) -> None:
        self.worker.free_sequences(seq_ids)
        self.cache.forget(seq_ids)

    def watch(self) -> None:
        """Block until :meth:`teardown`. Called once, in the executor's ``watch`` concurrency
        group (its own thread), so the call is outstanding for the actor's whole life: its
        result fails with ``ActorDiedError`` the moment the actor dies, which is how the
        executor notices a death while no step is in flight."""
        self._torn_down.wait()

    def teardown(self) -> None:
        """Leave the pipeline group before the actor is killed."""
        from vllm.worker.worker_process import teardown_stage_worker

        self._torn_down.set()

        if self.worker is not None:
            teardown_stage_worker(self.worker)
            self.worker = None
