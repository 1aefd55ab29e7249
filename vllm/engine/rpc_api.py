"""Upstream's call on every worker: ``LLMEngine.collective_rpc`` (``LLMEngine`` mixes it in;
``LLM.collective_rpc`` and ``LLM.apply_model`` go through it).

A call runs on every rank (each pipeline stage and tensor-parallel shard, or the one
in-process worker) after the steps already sent, and returns each rank's result in rank
order. ``method`` is a Worker method's name or a callable that takes the worker first, as
upstream's; the worker side is ``_rpc`` in vllm/worker/worker_process.py. The mp executor
sends the callable with :mod:`pickle`, so there it must be importable by name (a
module-level function, or a ``functools.partial`` of one); the in-process and Ray
executors take any callable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.worker.worker_process import USER_CALL


class WorkerCallMethods:
    """The call; the class it is mixed into provides ``executor`` (with
    ``collective_rpc``)."""

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``method`` on every worker rank and return the results by rank.

        Args:
            method: a Worker method's name (``"startup_summary"``, say), or a callable run
                as ``method(worker, *args, **kwargs)``.
            timeout: seconds to wait for the ranks in other processes (None: no limit).
            args / kwargs: its arguments (picklable when workers are other processes).
        Returns:
            One result per rank, rank 0 first (one element with a single worker).
        Raises:
            TypeError: ``args`` is not a tuple or list, ``kwargs`` not a dict, or (mp
                executor) the call cannot be pickled.
            AttributeError: the worker has no method of that name (in process).
            RuntimeError: a worker process or actor failed while running it (naming its
                rank and the remote error); only this call fails, the engine goes on.
            TimeoutError: ``timeout`` passed first (mp executor; Ray raises
                RuntimeError).
        """
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"collective_rpc args must be a tuple, got {type(args).__name__}.")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"collective_rpc kwargs must be a dict, got {type(kwargs).__name__}.")
        call = (method, tuple(args), dict(kwargs or {}))
        return self.executor.collective_rpc(USER_CALL, *call, timeout=timeout)
