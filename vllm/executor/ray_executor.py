"""The Ray executor: one Ray actor per rank (a tensor-parallel shard of a pipeline stage,
``tp x pp`` of them, rank ``pp_rank * tp + tp_rank``), on one host or across several.

Start-up: connect to the Ray cluster this process already joined (``ray.is_initialized()``),
the one named by ``RAY_ADDRESS``, or one ``ray start`` launched on this node; otherwise start
a small private one (``world_size`` CPUs, no dashboard, a small object store), which
:meth:`RayExecutor.shutdown` stops again. A placement group reserves one bundle per rank
(``{"GPU": 1, "CPU": 1}`` on CUDA, ``{"CPU": 1}`` on CPU), STRICT_PACK when one node can hold
every bundle, PACK otherwise (override: ``VLLM_RAY_PG_STRATEGY``; PACK keeps a stage's
consecutive bundles together where it can). Rank ``r`` is an actor of
:class:`~vllm.worker.ray_worker.RayStageWorker` in bundle ``r``; the actors join one
``torch.distributed`` group (gloo on CPU, NCCL on CUDA) at a port rank 0's node reports
free, on 127.0.0.1 when every actor shares the driver's node and on rank 0's node IP
otherwise. The EngineConfig is put into the object store once; each actor builds its own
layers from it (the same Worker code as the mp executor).

Steps: ``execute_model_async`` puts the request once and calls ``execute_model`` on every
actor; calls from one caller run in submission order on each actor, so every stage sees
the same step order. The returned ``concurrent.futures.Future`` resolves to the sampling
rank's (TP rank 0 of the last stage) SamplerOutput. Every rank's result is watched: an
actor that dies (or raises) fails every pending future and later call with a RuntimeError
naming its rank and node. A death while the engine is idle is noticed too: every actor has one
``watch`` call outstanding in a concurrency group of its own for its whole life, and that
call fails the moment the actor dies (no polling).
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future
from typing import Any

from vllm import envs
from vllm.executor.executor_base import PipelineExecutorBase, stage_worker_class
from vllm.sequence import ExecuteModelRequest
from vllm.worker.packed_output import unpack_outputs
from vllm.worker.request_delta import DriverRequestEncoder

logger = logging.getLogger(__name__)

# Object store of a local cluster the executor starts (Ray's minimum is about 75 MiB).
LOCAL_OBJECT_STORE_BYTES = 128 * 1024**2
# A stage's exception may be the echo of a neighbour's death: wait this long for the death.
DEATH_GRACE_S = 2.0


def import_ray():
    """Import Ray or explain how to install it.

    Raises:
        ImportError: Ray is not installed (names the ``vllm[ray]`` extra).
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "distributed_executor_backend='ray' needs Ray, which is not installed: "
            "pip install 'vllm[ray]' (or pip install -r requirements-ray.txt)."
        ) from e
    return ray


def _ray_start_address() -> str | None:
    """The address of a cluster started by ``ray start`` on this node, if any (Ray records
    the last one; its reader is private, so any failure means "none")."""
    try:
        from ray._private.services import find_bootstrap_address

        return find_bootstrap_address(None) or None
    except Exception:
        return None


class RayExecutor(PipelineExecutorBase):
    """Runs each pipeline stage in a Ray actor of one placement group.

    Attributes:
        world_size: number of stages (actors).
        actors: the actor handles, by rank.
        node_infos: per rank, ``{"node_id", "node_ip", "pid", "placement_group_id",
            "gpu_ids"}`` as reported by the actor.
        placement_group: the group holding one bundle per stage.
        started_ray: whether this executor started the Ray cluster (then it stops it).
    """

    def _init_executor(self) -> None:
        ray = import_ray()
        self._ray = ray
        self.world_size = self.config.parallel_config.world_size
        self._lock = threading.Lock()
        self._pending: set[Future] = set()
        self._error: RuntimeError | None = None
        self._closed = False
        self._encoder = DriverRequestEncoder()
        self.actors: list = []
        self.node_infos: list[dict[str, Any]] = []
        self.placement_group = None
        self.started_ray = False
        self._register_atexit()
        try:
            self._connect()
            self._start_actors()
            self._init_stage_caches()
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- start-up
    @property
    def _on_cuda(self) -> bool:
        return self.config.device_config.device == "cuda"

    def _connect(self) -> None:
        """Join the running / addressed cluster, or start a local one; check resources."""
        ray = self._ray
        if not ray.is_initialized():
            address = envs.RAY_ADDRESS or _ray_start_address()
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(
                    address="local",
                    num_cpus=self.world_size,
                    include_dashboard=False,
                    object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                    log_to_driver=False,
                )
                self.started_ray = True
        kind = "GPU" if self._on_cuda else "CPU"
        seen = ray.cluster_resources().get(kind, 0)
        if seen < self.world_size:
            raise RuntimeError(
                f"tensor_parallel_size x pipeline_parallel_size = {self.world_size} ranks "
                f"need {self.world_size} {kind}s in the Ray cluster (one per rank), but it has "
                f"{seen:g}; add nodes with `ray start --address=<head>:6379` or lower "
                "tensor_parallel_size or pipeline_parallel_size."
            )

    def _start_actors(self) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vllm.worker.ray_worker import RayStageWorker

        ray = self._ray
        kind = "GPU" if self._on_cuda else "CPU"
        bundle = {"GPU": 1, "CPU": 1} if self._on_cuda else {"CPU": 1}
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        fits_one = any(n["Resources"].get(kind, 0) >= self.world_size for n in nodes)
        strategy = envs.VLLM_RAY_PG_STRATEGY or ("STRICT_PACK" if fits_one else "PACK")
        pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy=strategy)
        self.placement_group = pg
        pg_timeout = envs.VLLM_RAY_PG_TIMEOUT_S
        try:
            ray.get(pg.ready(), timeout=pg_timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            self.placement_group = None
            raise RuntimeError(
                f"Ray could not reserve {self.world_size} bundles of {bundle} ({strategy}) "
                f"within {pg_timeout:.0f} s; available now: {ray.available_resources()}."
            ) from None
        cls = ray.remote(concurrency_groups={"watch": 1})(RayStageWorker)
        for rank in range(self.world_size):
            opts = {"num_cpus": 1, "num_gpus": 1 if self._on_cuda else 0}
            actor = cls.options(
                **opts,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=rank
                ),
            ).remote()
            self.actors.append(actor)
        self.node_infos = self._gather([a.node_info.remote() for a in self.actors], "start")
        driver_node = ray.get_runtime_context().get_node_id()
        one_node = {i["node_id"] for i in self.node_infos} == {driver_node}
        host = "127.0.0.1" if one_node else self.node_infos[0]["node_ip"]
        port = self._gather([self.actors[0].free_port.remote(host)], "start")[0]
        init_method = f"tcp://{host}:{port}"
        logger.info(
            "Ray stages on nodes %s, rendezvous %s",
            [i["node_ip"] for i in self.node_infos],
            init_method,
        )
        config_ref = ray.put(self.config)  # shipped once; each actor builds its layers
        worker_cls = stage_worker_class(self.config)
        refs = [
            a.setup.remote(config_ref, r, init_method, worker_cls)
            for r, a in enumerate(self.actors)
        ]
        self._gather(refs, "start", envs.VLLM_RAY_STARTUP_TIMEOUT_S)
        self._watch_actors()

    def _watch_actors(self) -> None:
        """Start each actor's life-long ``watch`` call; its failure marks the executor failed
        (so an idle engine's health check sees a dead stage within its next tick)."""
        for rank, actor in enumerate(self.actors):
            ref = actor.watch.options(concurrency_group="watch").remote()
            ref.future().add_done_callback(functools.partial(self._on_watch_done, rank))

    def _on_watch_done(self, rank: int, fut: Future) -> None:
        exc = fut.exception()
        if exc is not None:  # returns normally only after teardown
            self._on_stage_error(rank, exc)

    # ------------------------------------------------------------------- errors
    def _where(self, rank: int) -> str:
        info = self.node_infos[rank] if rank < len(self.node_infos) else {}
        return (
            f"pipeline worker rank {rank} (Ray actor on node {info.get('node_ip', '?')} "
            f"id {str(info.get('node_id', '?'))[:12]}, pid {info.get('pid', '?')})"
        )

    def _is_death(self, exc: BaseException) -> bool:
        ex = self._ray.exceptions
        return isinstance(exc, (ex.RayActorError, ex.ActorUnavailableError))

    def _fail(self, rank: int, what: str) -> None:
        """Mark the executor failed (first cause wins); fail every pending future."""
        with self._lock:
            if self._error is None:
                self._error = RuntimeError(
                    f"{self._where(rank)} {what}; the engine cannot continue."
                )
                logger.error("%s", self._error)
            pending = list(self._pending)
            self._pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(self._error)

    def _on_stage_error(self, rank: int, exc: BaseException) -> None:
        if self._closed:
            return
        if self._is_death(exc):
            self._fail(rank, f"died: {type(exc).__name__}: {str(exc)[:500]}")
        else:  # maybe the echo of a neighbour's death: give that death time to surface
            what = f"raised an exception:\n{exc}"
            timer = threading.Timer(DEATH_GRACE_S, self._fail, (rank, what))
            timer.daemon = True
            timer.start()

    def _gather(self, refs: list, what: str, timeout: float | None = None) -> list:
        """``ray.get`` every ref (one per rank, in rank order) naming the failing rank.

        Raises:
            RuntimeError: an actor died or raised (its rank and node named), or
                ``timeout`` seconds passed.
        """
        ray = self._ray
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        waited = 0.0
        while pending:
            if self._error is not None:
                raise self._error
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not ready:
                waited += 1.0
                if timeout is not None and waited >= timeout:
                    raise RuntimeError(
                        f"pipeline worker ranks {sorted(pending.values())} did not {what} "
                        f"within {timeout:.0f} s."
                    )
                continue
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except Exception as e:
                    if self._is_death(e):
                        self._fail(rank, f"died: {type(e).__name__}: {str(e)[:500]}")
                        raise self._error from e
                    raise RuntimeError(f"{self._where(rank)} failed ({what}):\n{e}") from e
        return [results[r] for r in sorted(results)]

    def _check_alive(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("the Ray executor was shut down.")

    # -------------------------------------------------------------------- steps
    def execute_model_async(
        self, request: ExecuteModelRequest | list[ExecuteModelRequest]
    ) -> Future:
        """Submit one step (or a round: a list of requests, vllm/worker/pp_stage.py) to
        every stage, in order; the future resolves to the last stage's SamplerOutput
        (their list for a round) or fails with the failing rank's error.

        Raises:
            RuntimeError: the executor already failed or was shut down.
        """
        fut: Future = Future()
        with self._lock:
            self._check_alive()
            enc = self._encoder.encode  # decode steps travel as deltas (request_delta.py)
            msg = [enc(r) for r in request] if isinstance(request, list) else enc(request)
            req_ref = self._ray.put(msg)  # serialized once for all stages
            refs = [a.execute_model.remote(req_ref) for a in self.actors]
            self._pending.add(fut)
        last = self.config.parallel_config.sampling_rank  # TP rank 0 of the last stage
        for rank, ref in enumerate(refs):
            ref.future().add_done_callback(
                functools.partial(self._on_step_done, rank, rank == last, fut)
            )
        return fut

    def _on_step_done(self, rank: int, is_last: bool, fut: Future, stage_fut: Future) -> None:
        exc = stage_fut.exception()
        if exc is not None:
            self._on_stage_error(rank, exc)
            return
        if is_last:
            with self._lock:
                self._pending.discard(fut)
            if not fut.done():
                fut.set_result(unpack_outputs(stage_fut.result()))

    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list:
        """Call ``Worker.<method>(*args)`` on every stage, after the steps already sent.

        Returns:
            The results, indexed by rank.
        Raises:
            RuntimeError: a stage failed or died (naming its rank and node).
        """
        with self._lock:
            self._check_alive()
            refs = [a.call.remote(method, args) for a in self.actors]
        return self._gather(refs, f"run {method!r}", timeout)

    def free_sequences(self, seq_ids: list[int]) -> None:
        if not seq_ids or self._error is not None or self._closed:
            return
        with self._lock:  # every stage caches sequences (request_delta.py)
            self._encoder.forget(seq_ids)
            for actor in self.actors:
                actor.free_sequences.remote(list(seq_ids))

    # ----------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Kill the actors, remove the placement group, stop a cluster this executor
        started (idempotent)."""
        if self._closed:
            return
        self._closed = True
        ray = getattr(self, "_ray", None)
        actors = getattr(self, "actors", [])
        if ray is not None and ray.is_initialized():
            if actors and self._error is None:  # leave the group cleanly when nothing hangs
                try:
                    ray.get([a.teardown.remote() for a in actors], timeout=5.0)
                except Exception:
                    pass
            for actor in actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
            if self.placement_group is not None:
                from ray.util.placement_group import remove_placement_group

                try:
                    remove_placement_group(self.placement_group)
                except Exception:
                    pass
        self.actors = []
        err = self._error or RuntimeError("the Ray executor was shut down.")
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
        self._finish_shutdown(pending, err)
        if self.started_ray and ray is not None and ray.is_initialized():
            ray.shutdown()
