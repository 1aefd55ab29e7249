"""Small shared helpers (and upstream's ``vllm.utils.FlexibleArgumentParser``)."""

from __future__ import annotations

import torch

from vllm.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser", "pin_for", "to_device"]


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Move a host tensor to ``device`` without waiting on the device.

    A copy from pageable host memory makes the CUDA stream synchronize first; staging the
    tensor in pinned memory (PyTorch caches pinned blocks) makes the upload asynchronous,
    so input preparation never stalls the GPU's queue. On CPU the tensor is returned as is.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def pin_for(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` in pinned host memory when ``device`` is CUDA (so a later ``copy_`` into a
    device buffer can be non-blocking), else ``t`` itself."""
    return t.pin_memory() if torch.device(device).type == "cuda" else t
