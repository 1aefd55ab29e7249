"""RMSNorm with an optional fused residual add."""

import torch
from torch import nn

from vllm.kernels.dispatch import get_triton_ops


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as Hugging Face ``LlamaRMSNorm``.

    ``y = weight * (x / sqrt(mean(x**2, -1) + eps))``, the normalisation computed in float32
    and cast back to the input dtype before the weight multiply, exactly as transformers does,
    so float32 results are bit-identical to the reference.

    ``forward(x, residual)`` first adds ``residual`` to ``x`` (the decoder's skip connection)
    and returns ``(normed, x + residual)``: the sum is the next residual.

    On CUDA the whole op is one fused Triton kernel (``norm_rotary.rms_norm`` /
    ``fused_add_rms_norm``, same rounding points; see ``vllm.kernels.dispatch`` for the rule);
    elsewhere ``forward_native`` (the torch code) runs.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)  # [num_tokens, hidden]
        variance = x.pow(2).mean(-1, keepdim=True)  # [num_tokens, 1]
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Args: x, residual: [num_tokens, hidden]. Returns normed x, or (normed, new residual)."""
        ops = get_triton_ops(x)
        if ops is None:
            return self.forward_native(x, residual)
        if residual is None:
            return ops.rms_norm(x, self.weight, self.variance_epsilon)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch reference of :meth:`forward` (runs on any device)."""
        if residual is None:
            return self._norm(x)
        x = residual + x  # [num_tokens, hidden]; same operand order as HF's skip add
        return self._norm(x), x

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``y = (x / sqrt(mean(x**2, -1) + eps)) * (1 + weight)``.

    Unlike :class:`RMSNorm` the scale is ``1 + weight`` (checkpoints store the offset from 1)
    and the multiply happens in float32 before the cast back to the input dtype, exactly as
    Hugging Face ``Gemma3RMSNorm``. Plain torch on every device (the fused Triton kernels
    implement Llama's rounding). ``forward(x, residual)`` adds the residual first, as
    :class:`RMSNorm` does.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        with torch.no_grad():
            self.weight.zero_()  # scale 1, as an untrained Gemma norm

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)  # [num_tokens, hidden]
        variance = x.pow(2).mean(-1, keepdim=True)  # [num_tokens, 1]
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return (x * (1.0 + self.weight.float())).to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Args: x, residual: [num_tokens, hidden]. Returns normed x, or (normed, new residual)."""
        return self.forward_native(x, residual)
