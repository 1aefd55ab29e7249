"""Whether a layer runs its fused Triton kernel or its torch code (``forward_native``).

Rule: the Triton path (:mod:`vllm.model_executor.layers.triton_ops`) is used when the
activation tensor is on CUDA, ``triton`` imports, and the environment variable
``VLLM_USE_TRITON_OPS`` is not ``"0"`` (default on; read at every call, so a process can
switch it). Everything else, CPU in particular, runs the unchanged torch code, so CPU
results stay bit-identical to Hugging Face. ``triton`` is imported lazily, on the first
CUDA tensor, so installs without it keep working.

The small-batch projection kernels (:mod:`triton_gemv`) follow the same rule, plus their
own switch ``VLLM_USE_TRITON_GEMV`` (default on) and a measured rule
(``triton_gemv.worthwhile``: one row, all weights small or all large); otherwise cuBLAS
runs them. Where they run and the step's attention offers ``PagedDecodeTables``, the fused
decoder layer (:mod:`triton_layer`, opt-in with ``VLLM_FUSED_DECODER_LAYER=1``) runs the
whole layer. All-greedy sampling without logprobs takes :mod:`triton_greedy` on the same
rule, with its own switch ``VLLM_USE_TRITON_GREEDY`` (default on).
"""

import functools
import logging
import os
from types import ModuleType
from typing import Any

import torch

logger = logging.getLogger(__name__)

ENV_USE_TRITON_OPS = "VLLM_USE_TRITON_OPS"
ENV_USE_TRITON_GEMV = "VLLM_USE_TRITON_GEMV"
ENV_FUSED_DECODER_LAYER = "VLLM_FUSED_DECODER_LAYER"
ENV_USE_TRITON_GREEDY = "VLLM_USE_TRITON_GREEDY"


@functools.cache
def _load_triton_ops() -> ModuleType | None:
    """The kernels module, or None (logged once) when triton cannot be imported."""
    try:
        from vllm.model_executor.layers import triton_ops
    except ImportError as e:
        logger.warning("Triton kernels unavailable (%s); using the torch layers", e)
        return None
    return triton_ops


def get_triton_ops(x: torch.Tensor) -> ModuleType | None:
    """The :mod:`triton_ops` module when ``x`` should take the Triton path, else None."""
    if not x.is_cuda or os.environ.get(ENV_USE_TRITON_OPS, "1") == "0":
        return None
    return _load_triton_ops()


@functools.cache
def _load_triton_gemv() -> ModuleType | None:
    """The small-batch projection kernels, or None when triton cannot be imported."""
    if _load_triton_ops() is None:
        return None
    from vllm.model_executor.layers import triton_gemv

    return triton_gemv


def get_triton_gemv(x: torch.Tensor, *weights: torch.Tensor) -> ModuleType | None:
    """:mod:`triton_gemv` when ``x`` [T, ...] takes the Triton path,
    ``VLLM_USE_TRITON_GEMV`` is not ``"0"`` and ``triton_gemv.worthwhile(T, *weights)``
    (one row; ``weights``: a layer's largest and smallest projections, or an lm_head, all
    small or all large), else None."""
    if get_triton_ops(x) is None or os.environ.get(ENV_USE_TRITON_GEMV, "1") == "0":
        return None
    gemv = _load_triton_gemv()
    return gemv if gemv is not None and gemv.worthwhile(x.shape[0], *weights) else None


@functools.cache
def _load_triton_layer() -> ModuleType | None:
    """The fused decoder-layer kernel, or None when triton cannot be imported."""
    if _load_triton_gemv() is None:
        return None
    from vllm.model_executor.layers import triton_layer

    return triton_layer


def get_triton_layer(
    x: torch.Tensor, attn_metadata, weight: torch.Tensor
) -> tuple[ModuleType, Any] | None:
    """``(triton_layer, tables)`` when a decoder layer whose projections take
    :mod:`triton_gemv` should run as one launch: ``x`` [1, hidden] (one row),
    ``VLLM_FUSED_DECODER_LAYER=1`` (default off), ``weight`` (the layer's largest
    projection) small enough for the tiled kernel whose tiles the fused layer runs
    (``triton_gemv.small_weights``; large layers take the whole-row kernel instead) and
    ``attn_metadata`` offers ``tables = paged_decode_tables()`` (fetched once here, for the
    launch); else None."""
    if x.shape[0] != 1 or attn_metadata is None:
        return None
    if os.environ.get(ENV_FUSED_DECODER_LAYER, "0") != "1":
        return None
    gemv = _load_triton_gemv()
    if gemv is None or not gemv.small_weights(weight):
        return None
    tables = attn_metadata.paged_decode_tables()
    layer = None if tables is None else _load_triton_layer()
    return None if layer is None else (layer, tables)


@functools.cache
def _load_triton_greedy() -> ModuleType | None:
    """The greedy-sampling kernels, or None when triton cannot be imported."""
    if _load_triton_ops() is None:
        return None
    from vllm.model_executor.layers import triton_greedy

    return triton_greedy


def get_triton_greedy(x: torch.Tensor) -> ModuleType | None:
    """:mod:`triton_greedy` when the logits ``x`` [rows, vocab] take the Triton path
    (:func:`get_triton_ops`) and ``VLLM_USE_TRITON_GREEDY`` is not ``"0"``, else None."""
    if get_triton_ops(x) is None or os.environ.get(ENV_USE_TRITON_GREEDY, "1") == "0":
        return None
    return _load_triton_greedy()
