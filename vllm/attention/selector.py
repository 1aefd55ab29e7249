"""Choose the attention backend (DESIGN.md "Devices and backends").

CUDA: FLASHINFER for float16/bfloat16 when flashinfer imports, TORCH_SDPA otherwise and for
float32. CPU: TORCH_SDPA. ``VLLM_ATTENTION_BACKEND`` picks one explicitly; an explicit choice
that cannot run is an error, only the default choice falls back (with a warning).
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

from vllm.attention.backends.abstract import AttentionBackend

logger = logging.getLogger(__name__)

BACKENDS = ("FLASHINFER", "TORCH_SDPA")


def _flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def which_attn_backend(device: str, dtype: torch.dtype) -> str:
    """Name of the backend to use for ``device`` ("cuda"/"cpu") and ``dtype``.

    Raises:
        ValueError: unknown VLLM_ATTENTION_BACKEND, or an explicit choice that cannot run
            (FLASHINFER on CPU, with float32, or without the flashinfer package).
    """
    explicit = os.environ.get("VLLM_ATTENTION_BACKEND")
    if explicit:
        if explicit not in BACKENDS:
            raise ValueError(f"VLLM_ATTENTION_BACKEND={explicit!r} is not one of {list(BACKENDS)}.")
        if explicit == "FLASHINFER":
            if device != "cuda":
                raise ValueError("VLLM_ATTENTION_BACKEND=FLASHINFER needs device='cuda'.")
            if dtype == torch.float32:
                raise ValueError(
                    "VLLM_ATTENTION_BACKEND=FLASHINFER does not support dtype float32; "
                    "use float16/bfloat16 or TORCH_SDPA."
                )
            if not _flashinfer_available():
                raise ValueError(
                    "VLLM_ATTENTION_BACKEND=FLASHINFER but flashinfer is not installed "
                    "(pip install flashinfer-python)."
                )
        return explicit
    if device == "cuda" and dtype != torch.float32:
        if _flashinfer_available():
            return "FLASHINFER"
        logger.warning("flashinfer is not installed; falling back to TORCH_SDPA.")
    return "TORCH_SDPA"


def get_attn_backend(name: str) -> type[AttentionBackend]:
    """The backend class for a name returned by :func:`which_attn_backend`."""
    if name == "FLASHINFER":
        from vllm.attention.backends.flashinfer import FlashInferBackend

        return FlashInferBackend
    from vllm.attention.backends.torch_sdpa import TorchSDPABackend

    return TorchSDPABackend
