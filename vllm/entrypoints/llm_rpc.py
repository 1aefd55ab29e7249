"""``LLM``'s calls on every worker (upstream's ``LLM.collective_rpc`` and
``LLM.apply_model``): reach the loaded model in place, as RL trainers do to read or update
weights between generate calls. See vllm/engine/rpc_api.py for how a call travels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_R = TypeVar("_R")


class WorkerCalls:
    """The methods; the class they are mixed into provides ``llm_engine``."""

    def collective_rpc(
        self,
        method: str | Callable[..., _R],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[_R]:
        """Run ``method`` on every worker rank (a Worker method's name, or a callable run as
        ``method(worker, *args, **kwargs)``) and return the results, rank 0 first.

        With pipeline or tensor parallelism on the mp executor (worker processes) the call
        and its arguments are pickled: pass a module-level function, not a lambda.

        Raises:
            TypeError: bad ``args`` / ``kwargs``, or a call the mp executor cannot pickle.
            AttributeError: no Worker method of that name (one in-process worker).
            RuntimeError: a worker process failed while running it (naming its rank and
                the remote error); the LLM stays usable.
            TimeoutError: ``timeout`` seconds passed first.
        """
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func: Callable[[Any], _R]) -> list[_R]:
        """``func(model)`` on every worker rank's ``torch.nn.Module`` (its pipeline stage's
        layers or tensor-parallel shard; the target model under speculative decoding);
        the results by rank. Changes ``func`` makes to weights are seen by later steps
        (CUDA graphs read the same parameter storage, so update weights in place).

        Raises:
            As :meth:`collective_rpc`.
        """
        return self.collective_rpc("apply_model", args=(func,))
