"""Programmatic dependent launch (PDL, Hopper and later) for the decode-path Triton kernels.

Why: a one-token decode step of a small model is a chain of ~150 short kernels (projection
GEMVs and attention), each a few microseconds, and in a CUDA graph each still pays about
two microseconds of launch and ramp before its first load. Launched with PDL, a kernel's
programs start while the kernel before it drains: they load what no earlier kernel writes
(the projection weights) and then wait (``griddepcontrol.wait``) until every earlier kernel
has finished and its writes are visible, so the chain's gaps overlap useful loads.

Contract for a kernel that takes ``PDL``: before :func:`pdl_wait` it reads only memory that
no kernel of the PDL chain it is part of writes (weights, norm weights; the decode
attention's older cache slots, lengths, positions and block tables, written before the
step's first, non-PDL kernel) and writes nothing; every other access comes after.
``pdl_wait`` also lets the next PDL kernel launch (``launch_dependents``), since that kernel
waits for this one in turn. Results are identical with and without PDL.

When the next kernel may launch: after this kernel's wait, i.e. once the kernel before it
finished. The next kernel's pre-wait loads still overlap this kernel's work, and at most one
kernel is launched ahead of the one computing. Triggering before the wait instead lets a
chain of small kernels (SmolLM2's tiled GEMVs and decode attention, whose grids are resident
at once) launch many kernels ahead, each holding SM slots while it waits, and measured
slower (an H200, bf16, 30 layers in one graph, the small path's five kernels a layer: the
SmolLM2 shape 26.3 us a layer against 20.9 at context 192, 32.5 against 21.4 at 1024; the
Qwen2.5-0.5B shape 45.0 against 45.5).

Used when :func:`pdl_enabled`: a CUDA device of compute capability >= 9.0, a Triton with
``launch_pdl`` and ``gdc_wait``, not the interpreter, and ``VLLM_TRITON_PDL`` on (default).
"""

import functools

import torch
import triton
import triton.language as tl

from vllm import envs

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None


@functools.cache
def _supported(device_index: int) -> bool:
    if gdc_wait is None or envs.TRITON_INTERPRET:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    if "launch_pdl" not in getattr(CUDAOptions, "__dataclass_fields__", {}):
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_enabled(x: torch.Tensor) -> bool:
    """Whether kernels on ``x``'s device launch with PDL (see the module docstring)."""
    if not x.is_cuda or not envs.VLLM_TRITON_PDL:
        return False
    return _supported(x.device.index if x.device.index is not None else 0)


def launch_options(pdl: bool) -> dict:
    """Launch keyword arguments for a kernel whose ``PDL`` constexpr is ``pdl`` (from one
    :func:`pdl_enabled` call per launch): ``{"launch_pdl": True}``, or none."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernels, then let the next one launch (no-op without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
