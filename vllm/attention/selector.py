"""Choose the attention backend (docs/design.md "Devices and backends").

CUDA: FLASHINFER for float16/bfloat16 when flashinfer imports, TORCH_SDPA otherwise and for
float32. CPU: TORCH_SDPA. ``--attention-backend`` (``DeviceConfig.attention_backend``,
upstream's flag) or else ``VLLM_ATTENTION_BACKEND`` picks one explicitly; an explicit
choice that cannot run is an error, only the default choice falls back (with a warning).
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from vllm import envs
from vllm.attention.backends.abstract import AttentionBackend
from vllm.attention.backends.flashinfer import FlashInferBackend
from vllm.attention.backends.torch_sdpa import TorchSDPABackend

logger = logging.getLogger(__name__)

BACKENDS = ("FLASHINFER", "TORCH_SDPA")
# Head sizes FlashInfer's prefill/decode kernels are built for; others fail inside the
# kernel dispatch ("Invalid configuration : NUM_MMA_Q=1 NUM_MMA_D_QK=1 ..." for 16).
FLASHINFER_HEAD_SIZES = (64, 128, 256)


def _flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def which_attn_backend(
    device: str, dtype: torch.dtype, head_size: int | None = None, chosen: str | None = None
) -> str:
    """Name of the backend to use for ``device`` ("cuda"/"cpu"), ``dtype`` and the model's
    ``head_size`` (None: not checked). ``chosen``: the ``--attention-backend`` value (any
    case), else VLLM_ATTENTION_BACKEND decides, else the default rule (module doc).

    Raises:
        ValueError: an explicit choice that is not one of :data:`BACKENDS` (upstream's
            other backends included) or that cannot run (FLASHINFER on CPU, with float32,
            with a head size outside FLASHINFER_HEAD_SIZES, or without the flashinfer
            package), naming where the choice came from.
    """
    source = "--attention-backend" if chosen else "VLLM_ATTENTION_BACKEND"
    explicit = chosen.upper() if chosen else envs.VLLM_ATTENTION_BACKEND
    if explicit:
        what = f"{source}={explicit}"
        if explicit not in BACKENDS:
            raise ValueError(
                f"{what} is not available here: the attention backends are {list(BACKENDS)} "
                "(upstream's other backends are not implemented)."
            )
        if explicit == "FLASHINFER":
            if device != "cuda":
                raise ValueError(f"{what} needs device='cuda'.")
            if dtype == torch.float32:
                raise ValueError(
                    f"{what} does not support dtype float32; use float16/bfloat16 or TORCH_SDPA."
                )
            if head_size is not None and head_size not in FLASHINFER_HEAD_SIZES:
                raise ValueError(
                    f"{what} does not support head_size={head_size} "
                    f"(supported: {list(FLASHINFER_HEAD_SIZES)}); use TORCH_SDPA."
                )
            if not _flashinfer_available():
                raise ValueError(
                    f"{what} but flashinfer is not installed (pip install flashinfer-python)."
                )
        return explicit
    if device == "cuda" and dtype != torch.float32:
        if head_size is not None and head_size not in FLASHINFER_HEAD_SIZES:
            logger.warning(
                "head_size %d is not one FlashInfer supports; using TORCH_SDPA.", head_size
            )
        elif _flashinfer_available():
            return "FLASHINFER"
        else:
            logger.warning("flashinfer is not installed; falling back to TORCH_SDPA.")
    return "TORCH_SDPA"


def get_attn_backend(name: str) -> type[AttentionBackend]:
    """The backend class for a name returned by :func:`which_attn_backend`."""
    return FlashInferBackend if name == "FLASHINFER" else TorchSDPABackend
