"""Gated activations applied to a fused [gate | up] projection."""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.kernels.dispatch import get_triton_ops


class SiluAndMul(nn.Module):
    """SwiGLU gate (Shazeer 2020): ``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``.

    Input [num_tokens, 2 * d] (the output of the fused gate_up projection, gate first);
    output [num_tokens, d]. Matches HF ``act_fn(gate_proj(x)) * up_proj(x)``. On CUDA one
    fused Triton kernel (``norm_rotary.silu_and_mul``); elsewhere ``forward_native``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = get_triton_ops(x)
        if ops is None:
            return self.forward_native(x)
        return ops.silu_and_mul(x)  # [num_tokens, d]

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """The torch reference of :meth:`forward` (runs on any device)."""
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]  # [num_tokens, d]


class GeluTanhAndMul(nn.Module):
    """GeGLU gate (Gemma): ``gelu_tanh(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``.

    Input [num_tokens, 2 * d] (gate first), output [num_tokens, d]; the tanh approximation of
    GELU, as transformers' ``gelu_pytorch_tanh``. Plain torch on every device.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]  # [num_tokens, d]


_ACT_AND_MUL = {"silu": SiluAndMul, "gelu_pytorch_tanh": GeluTanhAndMul}


def get_act_and_mul_fn(hidden_act: str) -> nn.Module:
    """Gated activation module for a config's ``hidden_act``.

    Raises:
        ValueError: an activation outside ``silu`` and ``gelu_pytorch_tanh``.
    """
    if hidden_act not in _ACT_AND_MUL:
        raise ValueError(
            f"hidden_act={hidden_act!r} is not supported; supported: {sorted(_ACT_AND_MUL)}"
        )
    return _ACT_AND_MUL[hidden_act]()
