"""The main loop of one pipeline-stage worker process (started by the mp executor).

Life of a worker process (started with multiprocessing "fork" or "spawn", see
vllm/executor/mp_executor.py):

1. Join the pipeline process group (gloo on CPU, NCCL on CUDA, device cuda:rank), build
   the :class:`~vllm.worker.worker.Worker` of stage ``rank``, load its layers, reply
   ``("ready", rank)``.
2. Serve messages from the driver, strictly in the order they arrive on its pipe:
   ``("step", step_id, request)`` runs ``Worker.execute_model`` (only the sampling rank, TP
   rank 0 of the last stage, replies with the SamplerOutput, or their list when ``request``
   is a list: a round of vllm/worker/pp_stage.py; any rank replies when it fails; decode
   groups arrive as deltas, vllm/worker/request_delta.py). Under PP at TP = 1 a step
   starts a stream instead (vllm/worker/pp_stream.py): the steps that follow join it
   as they arrive, each replied to when it finishes; ``("call", call_id, method,
   args)`` runs a Worker method and every rank replies; ``("free", seq_ids)`` forgets
   finished sequences; ``("shutdown",)`` leaves the group and exits.

A reader thread drains the pipe into a local queue so the driver never blocks on a busy
worker; when the driver's end closes (the engine process died) the worker exits at once,
so no stage outlives its engine. SIGINT and SIGTERM are ignored: a terminal's Ctrl-C, sent to
the whole process group, and a service manager's SIGTERM, sent to every process of the
service (systemd's default), are for the engine process to handle (a server drains its
requests first); the executor stops a stage by message, by closing its pipe or by SIGKILL.

Replies are ``(kind, id, rank, payload, error_text)`` tuples pickled onto the pipe.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from vllm.worker.request_delta import StageRequestCache

logger = logging.getLogger(__name__)

STEP = "step"
CALL = "call"
FREE = "free"
SHUTDOWN = "shutdown"
READY = "ready"
# The helper that runs a user's call (LLM.collective_rpc): its failure fails that call only.
USER_CALL = "rpc"


def _decode_step_counters(worker) -> dict:
    """This stage's graph-replay and eager step counters (the model runner keeps them,
    with or without graphs)."""
    return worker.model_runner.counters.snapshot()


def _attn_backend_name(worker) -> str:
    """The attention backend this stage runs (tests assert the one they asked for)."""
    return worker.model_runner.attn_backend_name


def _apply_model(worker, func: Callable[[Any], Any]) -> Any:
    """``func(model)`` on this rank's model (the target model under speculative decoding):
    upstream's ``LLM.apply_model``."""
    return func(worker.model_runner.model)


def _rpc(worker, method: str | Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A user's call (vllm/engine/rpc_api.py): ``method(worker, *args, **kwargs)`` for a
    callable, else the helper or Worker method of that name."""
    if callable(method):
        return method(worker, *args, **kwargs)
    fn = _HELPERS.get(method)
    return fn(worker, *args, **kwargs) if fn else getattr(worker, method)(*args, **kwargs)


def _spec_decode_metrics(worker) -> dict | None:
    """The speculative-decoding counters (vllm/spec_decode/metrics.py) of this rank's worker;
    None without speculation (TP rank 0 records them)."""
    metrics = getattr(worker, "metrics", None)
    return None if metrics is None else metrics.snapshot()


# Calls the driver may make that are not Worker methods.
_HELPERS = {
    "spec_decode_metrics": _spec_decode_metrics,
    "decode_step_counters": _decode_step_counters,
    "attn_backend_name": _attn_backend_name,
    "apply_model": _apply_model,
    USER_CALL: _rpc,
}


def setup_stage_worker(
    config, rank: int, local_rank: int, init_method: str, worker_cls=None, channels=None
):
    """Build stage ``rank``'s Worker, join the pipeline group, load its layers.

    Shared by the mp executor's processes and the Ray executor's actors.

    Args:
        config: the EngineConfig.
        rank: global rank ``pp_rank * tensor_parallel_size + tp_rank``, in [0, world_size).
        local_rank: CUDA device index in this process (0 under Ray, which sets
            CUDA_VISIBLE_DEVICES per actor).
        init_method: the process group's rendezvous URL (``tcp://<host>:<port>``).
        worker_cls: the worker class the executor chose (``vllm.executor.executor_base.
            stage_worker_class``: the speculative-decoding worker, which wraps this layer's
            Worker, comes from a layer above); default :class:`~vllm.worker.worker.Worker`.
        channels: this rank's host channels (``{(src, dst): HostChannel}``, the mp
            executor's, vllm/distributed/host_channel.py); None or empty: gloo only.

    Returns:
        The ready worker.
    """
    from vllm.distributed.communication import install_host_channels
    from vllm.distributed.parallel_state import init_distributed_environment
    from vllm.worker.worker import Worker

    worker = (worker_cls or Worker)(config, rank=rank, local_rank=local_rank)
    worker.init_device()
    par = config.parallel_config
    init_distributed_environment(
        rank, par.world_size, init_method, worker.device,
        tensor_parallel_size=par.tensor_parallel_size,
    )  # fmt: skip
    install_host_channels(channels or {}, rank)
    worker.load_model()
    return worker


def run_call(worker, method: str, args: tuple) -> Any:
    """Run a driver call on this stage: a helper of :data:`_HELPERS` or a Worker method.

    ``capture_graphs`` is the last start-up call (the executor makes it on every stage,
    graphs or not): after it the start-up objects are frozen out of the garbage collector
    (``gc.freeze()``, as the engine does in its own process), so the full collections that
    steps trigger stop walking them; :func:`teardown_stage_worker` unfreezes.
    """
    fn = _HELPERS.get(method)
    result = fn(worker, *args) if fn else getattr(worker, method)(*args)
    if method == "capture_graphs":
        gc.collect()
        gc.freeze()
    return result


def teardown_stage_worker(worker) -> None:
    """Finish queued CUDA work and leave the pipeline group (idempotent)."""
    import torch

    from vllm.distributed.parallel_state import destroy_distributed_environment

    gc.unfreeze()
    if torch.cuda.is_available() and worker.device.type == "cuda":
        torch.cuda.synchronize(worker.device)
    destroy_distributed_environment()


def _reader(conn: Connection, inbox: _Inbox) -> None:
    """Move pickled driver messages into ``inbox``; exit the process if the driver is gone."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)  # the engine process closed its end or died: never linger
        msg = pickle.loads(data)
        inbox.put(msg)
        if msg[0] == SHUTDOWN:
            return


class _Inbox:
    """The driver's messages in arrival order (filled by :func:`_reader`), with one
    message put back at the front: the one that ends a stream's admission.

    Every queued message also has one byte in a pipe, so a stage can wait for the next
    message and for its pipeline neighbour at once (``select`` on :attr:`wait_fd`,
    vllm/worker/pp_stream.py); :meth:`get` reads a message's byte when it takes it.
    """

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self._front: tuple | None = None
        self.wait_fd, self._wake_fd = os.pipe()

    def put(self, msg: tuple) -> None:
        self.queue.put(msg)
        os.write(self._wake_fd, b"\x01")

    def get(self, block: bool) -> tuple | None:
        """The next message; None when ``block`` is False and none is queued."""
        if self._front is not None:
            msg, self._front = self._front, None
            return msg
        try:
            msg = self.queue.get(block)
        except queue.Empty:
            return None
        os.read(self.wait_fd, 1)  # its byte (put writes it right after queueing)
        return msg

    def put_back(self, msg: tuple) -> None:
        self._front = msg


def _reply(conn: Connection, lock: threading.Lock, msg: tuple[Any, ...]) -> None:
    with lock:
        conn.send_bytes(pickle.dumps(msg))


def run_worker(
    config, rank: int, init_method: str, conn: Connection, worker_cls=None, channels=None
) -> None:
    """Entry point of a worker process: set up stage ``rank``, then serve the driver.

    Args:
        config: the EngineConfig (pickled under spawn, inherited under fork).
        rank: global rank (``pp_rank * tensor_parallel_size + tp_rank``).
        init_method: the process group's rendezvous URL (``tcp://127.0.0.1:<port>``).
        conn: this worker's end of its duplex pipe to the driver.
        worker_cls: see :func:`setup_stage_worker`.
        channels: see :func:`setup_stage_worker`.
    """
    # A terminal's Ctrl-C reaches the whole foreground process group, and systemd's stop
    # sends SIGTERM to every process of the service, this stage included. What either
    # means is the engine process's decision (`vllm serve` drains the requests in flight,
    # `LLM.generate` raises KeyboardInterrupt), and it stops this process through the pipe
    # (or by closing it, or SIGKILL), so the stage itself ignores both.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lock = threading.Lock()
    try:
        worker = setup_stage_worker(config, rank, rank, init_method, worker_cls, channels)
    except BaseException:
        _reply(conn, lock, (READY, None, rank, None, traceback.format_exc()))
        return
    _reply(conn, lock, (READY, None, rank, os.getpid(), None))

    inbox = _Inbox()
    threading.Thread(target=_reader, args=(conn, inbox), daemon=True).start()
    is_last = rank == config.parallel_config.sampling_rank  # TP rank 0 of the last stage
    cache = StageRequestCache()  # decode steps arrive as deltas (request_delta.py)
    streams = config.parallel_config.streams_calls

    def free(seq_ids: list[int]) -> None:
        worker.free_sequences(seq_ids)
        cache.forget(seq_ids)

    def next_call(block: bool):
        """A stream's next call (vllm/worker/pp_stream.py): frees are applied on the way;
        any other message ends admission and waits for this loop."""
        while True:
            msg = inbox.get(block)
            if msg is None:
                return None
            if msg[0] == FREE:
                free(msg[1])
            elif msg[0] == STEP and not isinstance(msg[2], list):
                return msg[1], cache.expand(msg[2])
            else:
                inbox.put_back(msg)
                return None

    def reply(tag, out) -> None:
        """A step's output to the driver (only the sampling rank replies)."""
        if is_last:
            _reply(conn, lock, (STEP, tag, rank, out, None))

    from vllm.worker.pp_stream import CallSource

    source = CallSource(next_call, reply, inbox.wait_fd)
    while True:
        msg = inbox.get(True)
        kind = msg[0]
        if kind == SHUTDOWN:
            break
        if kind == FREE:
            free(msg[1])
            continue
        tag = msg[1]
        try:
            if kind == STEP and streams and not isinstance(msg[2], list):
                worker.stream_calls(tag, cache.expand(msg[2]), source)
            elif kind == STEP:
                reply(tag, worker.execute_model(cache.expand(msg[2])))
            elif kind == CALL:
                result = run_call(worker, msg[2], msg[3])
                _reply(conn, lock, (CALL, tag, rank, result, None))
            else:
                raise ValueError(f"unknown message kind {kind!r}")
        except BaseException:
            _reply(conn, lock, (kind, tag, rank, None, traceback.format_exc()))
    try:
        teardown_stage_worker(worker)
    finally:
        conn.close()
