"""The pipeline-parallel process group of one worker process.

Each pipeline stage is one process of a ``torch.distributed`` group of ``world_size`` ranks
(rank = stage, since tensor parallelism is 1). The group is created by
:func:`init_distributed_environment` from a TCP rendezvous address the executor picked at
run time (``tcp://127.0.0.1:<free port>``); gloo on CPU, NCCL on CUDA. Stage ``r`` receives
from ``r - 1`` and sends to ``r + 1`` (see :mod:`vllm.distributed.communication`).

In a single-process engine no group exists and :func:`get_pp_group` returns None.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPGroup:
    """This process's place in the pipeline.

    Attributes:
        rank: this stage, in [0, world_size).
        world_size: number of stages.
        backend: "gloo" (CPU) or "nccl" (CUDA).
        device: the device tensors exchanged with neighbours live on.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def prev_rank(self) -> int | None:
        """The stage this one receives activations from (None on the first stage)."""
        return None if self.is_first_rank else self.rank - 1

    @property
    def next_rank(self) -> int | None:
        """The stage this one sends activations to (None on the last stage)."""
        return None if self.is_last_rank else self.rank + 1


_PP_GROUP: PPGroup | None = None


def get_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; never hard-coded)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def backend_for_device(device: torch.device) -> str:
    """ "nccl" for a CUDA device, "gloo" otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed_environment(
    rank: int,
    world_size: int,
    init_method: str,
    device: torch.device,
    timeout_s: float = 600.0,
) -> PPGroup:
    """Join the process group of the pipeline and remember this process's :class:`PPGroup`.

    Args:
        rank: this stage, in [0, world_size).
        world_size: number of stages (processes).
        init_method: rendezvous URL, e.g. ``tcp://127.0.0.1:29517``.
        device: this worker's device; CUDA selects NCCL, anything else gloo.
        timeout_s: how long collective set-up and point-to-point calls may wait.

    Raises:
        ValueError: ``rank`` outside [0, world_size).
        RuntimeError: a group already exists in this process.
    """
    global _PP_GROUP
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside [0, world_size={world_size}).")
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
    _PP_GROUP = PPGroup(rank, world_size, backend, device)
    logger.info("rank %d/%d joined the %s pipeline group", rank, world_size, backend)
    return _PP_GROUP


def get_pp_group() -> PPGroup | None:
    """The pipeline group of this process, or None in a single-process engine."""
    return _PP_GROUP


def destroy_distributed_environment() -> None:
    """Leave the process group (idempotent)."""
    global _PP_GROUP
    _PP_GROUP = None
    if dist.is_initialized():
        dist.destroy_process_group()
