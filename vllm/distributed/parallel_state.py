"""The process groups of one worker process: the whole world, and its tensor-parallel group.

Rank layout (vLLM's): ``world_size = tp_size * pp_size`` processes; global rank
``rank = pp_rank * tp_size + tp_rank``, so the ``tp_size`` ranks of one pipeline stage are
consecutive and form that stage's tensor-parallel group. The world group is created by
:func:`init_distributed_environment` from a TCP rendezvous address the executor picked at
run time (``tcp://127.0.0.1:<free port>``); gloo on CPU, NCCL on CUDA. Every rank then
creates every stage's TP group (``torch.distributed.new_group`` is collective over the
world), keeping its own; on CUDA a second, gloo, TP group carries small host-side checks
(the graph-plan agreement, :mod:`vllm.distributed.tp_ops`), and a gloo group over the
world carries the pipeline's plan headers between stages.

Between stages, rank ``(p, t)`` receives from ``(p - 1, t)`` and sends to ``(p + 1, t)``
(global ranks ``rank - tp_size`` and ``rank + tp_size``): every TP rank of a stage holds the
same, all-reduced activations, so each sends its own copy to its peer of the next stage
(see :mod:`vllm.distributed.communication`).

The sampling rank is TP rank 0 of the last stage, global rank ``(pp_size - 1) * tp_size``
(:func:`sampling_rank`): the logits are gathered there and only it samples and replies.

In a single-process engine no group exists: :func:`get_pp_group` returns None and the
tensor-parallel size is 1.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPGroup:
    """This process's place in the world of ``tp_size x pp_size`` ranks (see module docstring).

    Attributes:
        rank: global rank, in [0, world_size); ``pp_rank * tp_size + tp_rank``.
        world_size: ``tp_size * pp_size`` processes.
        backend: "gloo" (CPU) or "nccl" (CUDA).
        device: the device tensors exchanged with neighbours live on.
        tp_size: ranks per pipeline stage (tensor-parallel size).
        tp_group: this stage's TP process group (None when ``tp_size == 1``).
        tp_cpu_group: a gloo group over the same ranks for host-side checks (the same
            object as ``tp_group`` on CPU; None when ``tp_size == 1``).
        host_group: a gloo group over the whole world for the pipeline's plan headers
            (host values a stage must know before it launches a pass; on NCCL their
            read would wait for the device); None means the world group, itself gloo.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    tp_size: int = 1
    tp_group: Any = None
    tp_cpu_group: Any = None
    host_group: Any = None

    @property
    def pp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def pp_rank(self) -> int:
        """This process's pipeline stage."""
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        """This process's rank inside its stage's TP group."""
        return self.rank % self.tp_size

    @property
    def tp_ranks(self) -> list[int]:
        """Global ranks of this stage's TP group, in TP-rank order."""
        first = self.pp_rank * self.tp_size
        return list(range(first, first + self.tp_size))

    @property
    def is_first_rank(self) -> bool:
        """True on the first pipeline stage (any TP rank)."""
        return self.pp_rank == 0

    @property
    def is_last_rank(self) -> bool:
        """True on the last pipeline stage (any TP rank)."""
        return self.pp_rank == self.pp_size - 1

    @property
    def prev_rank(self) -> int | None:
        """The global rank this one receives activations from (None on the first stage)."""
        return None if self.is_first_rank else self.rank - self.tp_size

    @property
    def next_rank(self) -> int | None:
        """The global rank this one sends activations to (None on the last stage)."""
        return None if self.is_last_rank else self.rank + self.tp_size


_PP_GROUP: PPGroup | None = None


def get_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; never hard-coded)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def backend_for_device(device: torch.device) -> str:
    """ "nccl" for a CUDA device, "gloo" otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def sampling_rank(tp_size: int, pp_size: int) -> int:
    """Global rank that samples and replies: TP rank 0 of the last stage."""
    return (pp_size - 1) * tp_size


def init_distributed_environment(
    rank: int,
    world_size: int,
    init_method: str,
    device: torch.device,
    timeout_s: float = 600.0,
    tensor_parallel_size: int = 1,
) -> PPGroup:
    """Join the world group, create the TP groups, remember this process's :class:`PPGroup`.

    Args:
        rank: this process's global rank, in [0, world_size).
        world_size: ``tensor_parallel_size x pipeline stages`` processes.
        init_method: rendezvous URL, e.g. ``tcp://127.0.0.1:29517``.
        device: this worker's device; CUDA selects NCCL, anything else gloo.
        timeout_s: how long collective set-up and point-to-point calls may wait.
        tensor_parallel_size: ranks per stage (must divide ``world_size``).

    Raises:
        ValueError: ``rank`` outside [0, world_size), or ``tensor_parallel_size`` that does
            not divide ``world_size``.
        RuntimeError: a group already exists in this process.
    """
    global _PP_GROUP
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside [0, world_size={world_size}).")
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} does not divide world_size={world_size}."
        )
    if _PP_GROUP is not None or dist.is_initialized():
        raise RuntimeError("the pipeline process group is already initialized in this process.")
    backend = backend_for_device(device)
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
    tp = tensor_parallel_size
    tp_group = tp_cpu_group = None
    if tp > 1:
        for first in range(0, world_size, tp):  # every rank creates every group, in order
            ranks = list(range(first, first + tp))
            group = dist.new_group(ranks)
            cpu_group = dist.new_group(ranks, backend="gloo") if backend != "gloo" else group
            if first <= rank < first + tp:
                tp_group, tp_cpu_group = group, cpu_group
    host_group = None
    if backend != "gloo" and world_size > tp:  # pipeline stages that exchange headers
        host_group = dist.new_group(list(range(world_size)), backend="gloo")
    _PP_GROUP = PPGroup(rank, world_size, backend, device, tp, tp_group, tp_cpu_group, host_group)
    logger.info(
        "rank %d/%d (pp_rank %d, tp_rank %d of %d) joined the %s group",
        rank, world_size, _PP_GROUP.pp_rank, _PP_GROUP.tp_rank, tp, backend,
    )  # fmt: skip
    return _PP_GROUP


def get_pp_group() -> PPGroup | None:
    """The pipeline group of this process, or None in a single-process engine."""
    return _PP_GROUP


def get_tensor_model_parallel_world_size() -> int:
    """Ranks of this process's TP group (1 without a group)."""
    return 1 if _PP_GROUP is None else _PP_GROUP.tp_size


def get_tensor_model_parallel_rank() -> int:
    """This process's rank in its TP group (0 without a group)."""
    return 0 if _PP_GROUP is None else _PP_GROUP.tp_rank


def destroy_distributed_environment() -> None:
    """Leave the process group (idempotent)."""
    global _PP_GROUP
    _PP_GROUP = None
    if dist.is_initialized():
        dist.destroy_process_group()
