"""The multiprocessing executor: one process per rank (tensor-parallel shard of a pipeline
stage) on this host; ``world_size = tp * pp``, rank ``pp_rank * tp + tp_rank``.

Start method (:func:`worker_start_method`): "fork" when CUDA is not initialised in this
process, else "spawn" (a forked child cannot use CUDA its parent initialised);
``VLLM_WORKER_MULTIPROC_METHOD`` chooses explicitly. Fork is what lets a script create the
engine at its top level, or come from stdin (``python -``): a spawned child re-imports the
main module, so a guard-less script starts a second engine inside the child, which
multiprocessing refuses; the start-up error then says the script needs an
``if __name__ == "__main__":`` guard. Fork has its own precondition: GNU OpenMP's thread
pool does not survive it, so a child of a process that already ran multi-threaded torch
CPU ops hangs in its first parallel region; such a process (a test that ran a PP = 1
engine first) sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``.

How a step flows: ``execute_model_async(request)`` pickles the request once and writes it
to every stage's pipe (under one lock, so every stage sees the same order) and returns a
``concurrent.futures.Future``. Each stage runs steps strictly in arrival order; stage r > 0
receives IntermediateTensors from r - 1, stage r < P - 1 sends them to r + 1, and only the
last stage replies, with packed sample rows (vllm/worker/packed_output.py) that the
watcher unpacks into the SamplerOutput which resolves the future. The executor itself
does not bound the steps in flight; the engine keeps at most one per virtual engine.

A background thread (the "watcher") reads every reply and waits on every process
sentinel. When a worker process dies, or a stage reports an exception, the executor is
failed: every pending future gets a RuntimeError naming the stage's rank, and every later
call raises it, so the engine errors out instead of hanging.

KV-cache sizing: each stage computes ``determine_num_available_blocks()`` (blocks per
virtual engine); the minimum over stages is allocated on every stage, so block numbers
chosen by a scheduler are valid on all of them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import pickle
import threading
import time
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import wait
from typing import Any

from vllm import envs
from vllm.distributed.parallel_state import get_free_port
from vllm.executor.executor_base import PipelineExecutorBase, stage_worker_class
from vllm.sequence import ExecuteModelRequest
from vllm.worker import worker_process as wp
from vllm.worker.packed_output import unpack_outputs
from vllm.worker.request_delta import DriverRequestEncoder

logger = logging.getLogger(__name__)

# Seconds a worker may take to start (process start, imports, weights).
STARTUP_TIMEOUT_S = 600.0
# Seconds shutdown waits for a clean exit before kill() (workers ignore SIGTERM), then after.
JOIN_TIMEOUT_S = 5.0


class MultiprocessingExecutor(PipelineExecutorBase):
    """Runs one :class:`~vllm.worker.worker.Worker` per pipeline stage in its own process.

    Attributes:
        world_size: number of stages (processes).
        worker_pids: pid of each stage's process, by rank.
    """

    def _init_executor(self) -> None:
        self.world_size = self.config.parallel_config.world_size
        # the stages serve steps as a stream (vllm/worker/pp_stream.py): multi-step calls
        # of different virtual engines interleave without rounds
        self.streams_calls = self.config.parallel_config.streams_calls
        self._lock = threading.Lock()  # guards futures, calls, error and pipe writes
        self._step_ids = itertools.count()
        self._call_ids = itertools.count()
        self._steps: dict[int, Future] = {}
        # call id -> (future, {rank: (result, error text)}, the method's name)
        self._calls: dict[int, tuple[Future, dict[int, Any], str]] = {}
        self._error: RuntimeError | None = None
        self._closing = False
        self._closed = False
        self._encoder = DriverRequestEncoder()  # decode steps travel as deltas
        self.workers: list[multiprocessing.Process] = []
        self._conns = []
        self.worker_pids: list[int] = []
        self.start_method = worker_start_method()
        ctx = multiprocessing.get_context(self.start_method)
        init_method = f"tcp://127.0.0.1:{get_free_port()}"
        worker_cls = stage_worker_class(self.config)
        channels = _host_channels(ctx, self.config)
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            own = {pair: chan for pair, chan in channels.items() if rank in pair}
            target, args = wp.run_worker, (self.config, rank, init_method, child, worker_cls, own)
            if self.start_method == "fork":  # the child must not hold the driver's ends
                target, args = _run_forked_worker, ([*self._conns, parent], *args)
            proc = ctx.Process(target=target, args=args, name=f"vllm-pp-worker-{rank}", daemon=True)
            proc.start()
            child.close()
            self.workers.append(proc)
            self._conns.append(parent)
        # Registered before the first wait so an interrupted start-up still cleans up.
        self._register_atexit()
        try:
            self._wait_ready()
            self._watcher = threading.Thread(
                target=self._watch, name="vllm-mp-executor-watcher", daemon=True
            )
            self._watcher.start()
            self._init_stage_caches()
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- start-up
    def _wait_ready(self) -> None:
        """Wait for every stage's READY reply (or a failure / death, which raises)."""
        pids: dict[int, int] = {}
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.workers)}
        while pending:
            ready = wait([*pending, *sentinels], timeout=STARTUP_TIMEOUT_S)
            if not ready:
                raise RuntimeError(
                    f"pipeline workers of ranks {sorted(pending.values())} did not start "
                    f"within {STARTUP_TIMEOUT_S:.0f} s."
                )
            for obj in sorted(ready, key=lambda o: o not in pending):  # replies first
                if obj in pending:
                    rank = pending.pop(obj)
                    try:
                        _, _, r, pid, err = pickle.loads(obj.recv_bytes())
                    except (EOFError, OSError):
                        raise self._exited_during_start_up(rank) from None
                    if err is not None:
                        raise RuntimeError(f"pipeline worker rank {rank} failed to start:\n{err}")
                    pids[r] = pid
                elif obj in sentinels:
                    raise self._exited_during_start_up(sentinels[obj])
        self.worker_pids = [pids[r] for r in range(self.world_size)]

    def _exited_during_start_up(self, rank: int) -> RuntimeError:
        """The error for a stage whose process ended before it was ready (reaped first, so
        the exit code is the real one)."""
        proc = self.workers[rank]
        proc.join(JOIN_TIMEOUT_S)
        return RuntimeError(start_up_exit_message(rank, proc.exitcode, self.start_method))

    # ------------------------------------------------------------------ watcher
    def _watch(self) -> None:
        """Dispatch replies; fail the executor when a stage dies or reports an error."""
        conns = {conn: rank for rank, conn in enumerate(self._conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.workers)}
        while not self._closing:
            ready = wait([*conns, *sentinels], timeout=0.5)
            # Deaths first: a dead stage is the root cause of its neighbours' errors.
            for obj in sorted(ready, key=lambda o: o in conns):
                if self._closing:
                    return
                if obj in conns:
                    rank = conns[obj]
                    try:
                        msg = pickle.loads(obj.recv_bytes())
                    except (EOFError, OSError):
                        self._fail(rank, "closed its pipe (the process died)")
                        return
                    self._dispatch(msg)
                else:
                    rank = sentinels[obj]
                    code = _exit_code(self.workers[rank], timeout=0.1)
                    self._fail(rank, f"died unexpectedly (exit code {code})")
                    return

    def _dispatch(self, msg: tuple) -> None:
        kind, tag, rank, payload, err = msg
        if err is not None and not self._user_call(kind, tag):
            # A neighbour's death (the cause) often surfaces first as this stage's
            # communication error. A dying process closes its sockets and its sentinel
            # together, before it becomes reapable: a ready sentinel marks it dead.
            ready = wait([p.sentinel for p in self.workers], timeout=1.0)
            dead = [r for r, p in enumerate(self.workers) if p.sentinel in ready]
            if dead:
                code = _exit_code(self.workers[dead[0]], timeout=1.0)
                self._fail(dead[0], f"died unexpectedly (exit code {code})")
            else:
                self._fail(rank, f"raised an exception while running a {kind!r} message:\n{err}")
            return
        if kind == wp.STEP:  # packed sample rows -> SamplerOutputs, outside the lock
            payload = unpack_outputs(payload)
        with self._lock:
            if kind == wp.STEP:
                fut = self._steps.pop(tag, None)
                if fut is not None and not fut.done():
                    fut.set_result(payload)
            elif kind == wp.CALL and tag in self._calls:
                fut, results, method = self._calls[tag]
                results[rank] = (payload, err)
                if len(results) == self.world_size:
                    del self._calls[tag]
                    failed = [(r, e) for r, (_, e) in sorted(results.items()) if e is not None]
                    with contextlib.suppress(InvalidStateError):  # cancelled: timed out
                        if failed:
                            r, e = failed[0]
                            fut.set_exception(
                                RuntimeError(f"pipeline worker rank {r} failed in {method!r}:\n{e}")
                            )
                        else:
                            fut.set_result([results[r][0] for r in range(self.world_size)])

    def _user_call(self, kind: str, tag: int) -> bool:
        """Whether a reply belongs to a user's call (``LLM.collective_rpc``, the ``rpc``
        helper): its failure fails that call only, and the workers keep serving. Any
        other call's or step's failure stops the executor."""
        with self._lock:
            return kind == wp.CALL and tag in self._calls and self._calls[tag][2] == wp.USER_CALL

    def _fail(self, rank: int, what: str) -> None:
        """Mark the executor failed and fail every pending future with the rank's error."""
        pid = self.worker_pids[rank] if rank < len(self.worker_pids) else None
        with self._lock:
            if self._error is None:
                self._error = RuntimeError(
                    f"pipeline worker rank {rank} (pid {pid}) {what}; the engine cannot continue."
                )
                logger.error("%s", self._error)
            pending = [*self._steps.values(), *(c[0] for c in self._calls.values())]
            self._steps.clear()
            self._calls.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(self._error)

    # ------------------------------------------------------------------ sending
    def _broadcast(self, msg: tuple, ranks: range | list[int] | None = None) -> None:
        """Pickle ``msg`` once and write it to the given stages (all by default); caller
        holds ``self._lock`` so every stage receives messages in the same order."""
        try:
            data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise TypeError(
                f"cannot send this call to the worker processes: {e}. The mp executor "
                "pickles it: pass a module-level function (or a functools.partial of one), "
                "not a lambda, closure or local function."
            ) from e
        for rank in ranks if ranks is not None else range(self.world_size):
            try:
                self._conns[rank].send_bytes(data)
            except (BrokenPipeError, OSError) as e:
                raise RuntimeError(f"pipeline worker rank {rank} is unreachable: {e}") from e

    def _check_alive(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed or self._closing:
            raise RuntimeError("the multiprocessing executor was shut down.")

    def execute_model_async(
        self, request: ExecuteModelRequest | list[ExecuteModelRequest]
    ) -> Future:
        """Submit one step (or a round: a list of requests, vllm/worker/pp_stage.py) to
        every stage; the future resolves to the last stage's SamplerOutput (their list for
        a round; None for an empty request) or fails with the failing rank's error.

        Raises:
            RuntimeError: the executor already failed or was shut down.
        """
        fut: Future = Future()
        with self._lock:
            self._check_alive()
            step_id = next(self._step_ids)
            self._steps[step_id] = fut
            enc = self._encoder.encode
            msg = [enc(r) for r in request] if isinstance(request, list) else enc(request)
            self._broadcast((wp.STEP, step_id, msg))
        return fut

    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list:
        """Call ``Worker.<method>(*args)`` on every stage, after the steps already sent.

        Returns:
            The results, indexed by rank.
        Raises:
            RuntimeError: a stage failed or died (naming its rank); for a user's call
                (``rpc``, see :meth:`_user_call`) only that call fails.
            TimeoutError: ``timeout`` seconds passed first (the call still runs on the
                stages; its results are dropped).
        """
        fut: Future = Future()
        with self._lock:
            self._check_alive()
            call_id = next(self._call_ids)
            self._calls[call_id] = (fut, {}, method)
            try:
                self._broadcast((wp.CALL, call_id, method, args))
            except TypeError:  # nothing was sent: the call could not be pickled
                del self._calls[call_id]
                raise
        try:
            return fut.result(timeout=timeout)
        except TimeoutError:
            if not fut.cancel():  # the results came in just now
                return fut.result()
            raise TimeoutError(
                f"pipeline workers did not finish {method!r} within {timeout} s (it still runs "
                "there; its results will be dropped)."
            ) from None

    def free_sequences(self, seq_ids: list[int]) -> None:
        if not seq_ids or self._error is not None or self._closing or self._closed:
            return
        with self._lock:  # every stage caches sequences (request_delta.py)
            self._encoder.forget(seq_ids)
            self._broadcast((wp.FREE, list(seq_ids)))

    # ----------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop every worker process (idempotent): ask, join, then kill (workers ignore
        SIGTERM, see vllm/worker/worker_process.py)."""
        if self._closed:
            return
        self._closing = True
        self._closed = True
        workers = getattr(self, "workers", [])
        for conn in getattr(self, "_conns", []):
            try:
                conn.send_bytes(pickle.dumps((wp.SHUTDOWN,)))
            except Exception:
                pass
        watcher = getattr(self, "_watcher", None)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(2.0)
        for proc in workers:
            proc.join(JOIN_TIMEOUT_S)
        alive = [p for p in workers if p.is_alive()]
        for proc in alive:
            proc.kill()
        for proc in alive:
            proc.join(JOIN_TIMEOUT_S)
        for conn in getattr(self, "_conns", []):
            try:
                conn.close()
            except Exception:
                pass
        err = RuntimeError("the multiprocessing executor was shut down.")
        with self._lock:
            pending = [*self._steps.values(), *(c[0] for c in self._calls.values())]
            self._steps.clear()
            self._calls.clear()
        self._finish_shutdown(pending, self._error or err)


def worker_start_method() -> str:
    """How stage processes start: ``VLLM_WORKER_MULTIPROC_METHOD`` ("fork" or "spawn") when
    set, else "fork" unless CUDA is initialised in this process; "spawn" whenever CUDA is
    initialised (a forked child cannot use it; an explicit "fork" is overridden, with a
    warning).

    Raises:
        ValueError: the variable is set to another method (naming it and the choices).
    """
    import torch

    method = envs.VLLM_WORKER_MULTIPROC_METHOD
    if method not in (None, "fork", "spawn"):
        raise ValueError(f"VLLM_WORKER_MULTIPROC_METHOD must be 'fork' or 'spawn', got {method!r}.")
    if torch.cuda.is_initialized():
        if method == "fork":
            logger.warning("CUDA is initialised in this process: starting workers with spawn.")
        return "spawn"
    return method or "fork"


def start_up_exit_message(rank: int, exit_code: int | None, start_method: str) -> str:
    """What to say when stage ``rank``'s process ended before it was ready.

    Under spawn the usual cause is a main module without an ``if __name__ == "__main__":``
    guard: the child re-imports it, reaches the engine's construction again and
    multiprocessing stops it (its own explanation is in the child's stderr), so the message
    says so.
    """
    msg = (
        f"pipeline worker rank {rank} failed to start: its process exited during start-up "
        f"(exit code {exit_code})."
    )
    if start_method == "spawn":
        msg += (
            " Workers were started with the 'spawn' method, which re-imports the main "
            "module in every worker: a script that creates the engine at its top level "
            'needs an `if __name__ == "__main__":` guard around that code (see the '
            "worker's own error above in stderr)."
        )
    return msg


def _exit_code(proc, timeout: float) -> int | str:
    """``proc``'s exit code, polled (non-blocking ``waitpid``) for up to ``timeout``
    seconds; "pending" when it is not reapable by then. Not ``proc.join(timeout)``: once
    the sentinel is ready, join waits for the exit without a bound, and a process whose
    device files take long to release would stall the watcher."""
    deadline = time.monotonic() + timeout
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return proc.exitcode if proc.exitcode is not None else "pending"


def _host_channels(ctx, config) -> dict:
    """The pipeline's shared-memory channels (vllm/distributed/host_channel.py), sized for
    the hidden states and residual of the largest step on CPU (where they travel as host
    data; ``max(max_num_seqs, max_num_batched_tokens)`` rows, within the ring's cap) and
    for plan headers alone on CUDA; none when ``VLLM_PP_HOST_CHANNELS=0``."""
    from vllm.distributed.host_channel import pipeline_channels

    par = config.parallel_config
    if not envs.VLLM_PP_HOST_CHANNELS or par.world_size <= par.tensor_parallel_size:
        return {}
    mc = config.model_config
    message = 4096  # plan headers, bytes
    if config.device_config.device == "cpu":
        sc = config.scheduler_config
        rows = max(sc.max_num_seqs, sc.max_num_batched_tokens)
        message = max(message, 2 * rows * mc.hf_config.hidden_size * mc.torch_dtype.itemsize)
    return pipeline_channels(ctx, par.world_size, par.tensor_parallel_size, message)


def _run_forked_worker(driver_conns: list, *args) -> None:
    """A forked stage: close the inherited driver ends of every pipe (so the stage sees EOF
    when the driver goes away), then :func:`~vllm.worker.worker_process.run_worker`."""
    for conn in driver_conns:
        conn.close()
    wp.run_worker(*args)
