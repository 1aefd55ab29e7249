"""Which Triton kernel module, if any, a layer or an attention backend runs: the one place
the rest of the engine reaches :mod:`vllm.kernels` through.

Rule: the fused norm / rotary / SiLU kernels (:mod:`vllm.kernels.norm_rotary`) are used
when the activation tensor is on CUDA, ``triton`` imports, and ``VLLM_USE_TRITON_OPS`` is
on (default; read through :mod:`vllm.envs` at every call, so a process can switch it).
Everything else, CPU in particular, runs the unchanged torch code, so CPU results stay
bit-identical to Hugging Face.

The small-batch projection kernels (:mod:`vllm.kernels.gemv`) follow the same rule, plus
their own switch ``VLLM_USE_TRITON_GEMV`` (default on) and a measured rule
(``gemv.worthwhile``: one row, all weights small or all large); otherwise cuBLAS runs
them. All-greedy sampling without logprobs takes :mod:`vllm.kernels.greedy` on the same
rule, with its own switch ``VLLM_USE_TRITON_GREEDY`` (default on); so does a decode-loop
step's bookkeeping (:mod:`vllm.kernels.decode_step`, :func:`get_triton_decode_step`,
without a switch of its own). FLASHINFER's
small-decode path runs :mod:`vllm.kernels.decode_attention` (:func:`decode_attention`).
Mixture-of-experts layers run :mod:`vllm.kernels.fused_moe` on the same rule as the fused
norm / rotary kernels (:func:`get_triton_moe`), and so does the W8A8 path's activation
quantization (:mod:`vllm.kernels.fp8_quant`, :func:`get_triton_fp8_quant`).

Every kernel module imports ``triton`` at its top, so they are imported by name here on
first use (:func:`_import`): installs without ``triton`` and CPU-only processes never
import it.
"""

import functools
import importlib
import logging
from types import ModuleType

import torch

from vllm import envs

logger = logging.getLogger(__name__)


@functools.cache
def _import(name: str) -> ModuleType:
    """``vllm.kernels.<name>``, imported once.

    Raises:
        ImportError: ``triton`` (or a kernel it needs) cannot be imported.
    """
    return importlib.import_module(f"vllm.kernels.{name}")


@functools.cache
def _load(name: str) -> ModuleType | None:
    """``vllm.kernels.<name>``, or None (logged once) when triton cannot be imported."""
    try:
        return _import(name)
    except ImportError as e:
        logger.warning("Triton kernels unavailable (%s); using the torch layers", e)
        return None


def get_triton_ops(x: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.norm_rotary` when ``x`` should take the Triton path, else None."""
    if not x.is_cuda or not envs.VLLM_USE_TRITON_OPS:
        return None
    return _load("norm_rotary")


def get_triton_gemv(x: torch.Tensor, *weights: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.gemv` when ``x`` [T, ...] takes the Triton path
    (:func:`get_triton_ops`), ``VLLM_USE_TRITON_GEMV`` is on and
    ``gemv.worthwhile(T, *weights)`` (one row; ``weights``: a layer's largest and smallest
    projections, or an lm_head, all small or all large), else None."""
    if get_triton_ops(x) is None or not envs.VLLM_USE_TRITON_GEMV:
        return None
    gemv = _load("gemv")
    return gemv if gemv is not None and gemv.worthwhile(x.shape[0], *weights) else None


def get_triton_greedy(x: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.greedy` when the logits ``x`` [rows, vocab] take the Triton path
    (:func:`get_triton_ops`) and ``VLLM_USE_TRITON_GREEDY`` is on, else None."""
    if get_triton_ops(x) is None or not envs.VLLM_USE_TRITON_GREEDY:
        return None
    return _load("greedy")


def get_triton_decode_step(x: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.decode_step` (a decode-loop step's bookkeeping in one launch each)
    when the integer tensor ``x`` of that step is on CUDA and ``triton`` imports (the rule
    of :func:`get_triton_ops`), else None."""
    if get_triton_ops(x) is None:
        return None
    return _load("decode_step")


def get_triton_fp8_quant(x: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.fp8_quant` (one-launch per-row fp8 quantization) when the
    activations ``x`` [T, K] take the Triton path (:func:`get_triton_ops`), else None."""
    if get_triton_ops(x) is None:
        return None
    return _load("fp8_quant")


def get_triton_moe(x: torch.Tensor) -> ModuleType | None:
    """:mod:`vllm.kernels.fused_moe` when the activations ``x`` [T, H] take the Triton path
    (:func:`get_triton_ops`), else None."""
    if get_triton_ops(x) is None:
        return None
    return _load("fused_moe")


def decode_attention() -> ModuleType:
    """:mod:`vllm.kernels.decode_attention`, the small-batch paged decode kernel (no torch
    fallback: FLASHINFER takes its small-decode path only where triton runs).

    Raises:
        ImportError: ``triton`` cannot be imported.
    """
    return _import("decode_attention")
