"""OLMo 2 and OLMo 3 decoders (Ai2 2024, 2025): ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``.

Llama's projections and SwiGLU MLP with OLMo's differences:

- post-norm layers: ``h = x + post_attention_norm(attn(x))``,
  ``out = h + post_feedforward_norm(mlp(h))``; no norm before attention or the MLP, the
  final norm on the residual stream;
- ``q_norm`` / ``k_norm``: one RMSNorm over all query channels (``heads * head_dim``) and
  one over all key channels, before RoPE (Qwen3's are per head);
- every RMSNorm multiplies its float32 normalised input by the weight and then rounds to
  the model dtype (Llama rounds first), as transformers' ``Olmo2RMSNorm``;
- OLMo 3: sliding-window and global layers (``layer_types``) with a RoPE per layer type
  (``rope_parameters[layer_type]``), as Gemma 3.

Tensor parallelism: q/k norms span every rank's heads, so each rank holds its heads' slice
of the norm weight and the ranks all-reduce their sums of squares (:class:`ShardedRMSNorm`).
Numerics follow Hugging Face ``Olmo2ForCausalLM`` / ``Olmo3ForCausalLM``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.distributed.tp_ops import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.gemma3 import (
    check_sliding_window,
    gemma3_layer_windows,
    rotary_per_layer_type,
)
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    layer_index,
)
from vllm.model_executor.weight_utils import default_weight_loader, narrow_weight


class OlmoRMSNorm(RMSNorm):
    """``(weight * (x / sqrt(mean(x**2, -1) + eps))).to(x.dtype)``: the weight multiply in
    float32 before the rounding, as transformers' ``Olmo2RMSNorm``. Plain torch on every
    device (the fused Triton kernels implement Llama's rounding); ``forward(x, residual)``
    adds the residual first, as :class:`RMSNorm`."""

    def _variance(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, width] float32 -> the mean of squares per row [num_tokens, 1]."""
        return x.pow(2).mean(-1, keepdim=True)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)  # [num_tokens, width]
        variance = self._variance(x)  # [num_tokens, 1]
        return (self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))).to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Args: x, residual: [num_tokens, width]. Returns normed x, or (normed, x + residual)."""
        return self.forward_native(x, residual)


class ShardedRMSNorm(OlmoRMSNorm):
    """:class:`OlmoRMSNorm` over ``total_heads * head_dim`` channels of which this TP rank
    holds heads ``[head_start, head_start + num_heads)``.

    ``weight`` [num_heads * head_dim] is that slice (its ``weight_loader`` cuts it from the
    checkpoint's full vector). The mean of squares over all channels is the all-reduced sum
    of every rank's local sums divided by ``replicas * total_heads * head_dim``, where
    ``replicas`` is how many ranks hold each head (``tp / total_heads`` when the heads are
    replicated, else 1). At TP = 1 it is exactly OlmoRMSNorm.
    """

    def __init__(self, num_heads: int, head_dim: int, total_heads: int, head_start: int,
                 replicas: int, eps: float) -> None:  # fmt: skip
        super().__init__(num_heads * head_dim, eps)
        self.weight.weight_loader = self._load
        self.start, self.width = head_start * head_dim, num_heads * head_dim
        self.total = replicas * total_heads * head_dim
        self.sharded = self.width * replicas != self.total

    def _load(self, param: nn.Parameter, full) -> None:
        """Copy this rank's slice of the checkpoint's full weight [total_heads * head_dim]
        (a tensor or a lazy safetensors slice).

        Raises:
            ValueError: the checkpoint vector does not hold this rank's channels.
        """
        default_weight_loader(param, narrow_weight(full, 0, self.start, self.width))

    def _variance(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sharded:
            return super()._variance(x)
        return tensor_model_parallel_all_reduce(x.pow(2).sum(-1, keepdim=True)) / self.total


class Olmo2Attention(LlamaAttention):
    """Llama attention with OLMo's whole-projection q/k norms and (OLMo 3) the layer's
    sliding window."""

    def __init__(self, config: PretrainedConfig, *args, prefix: str, **kwargs) -> None:
        super().__init__(config, *args, prefix=prefix, **kwargs)
        qkv, eps = self.qkv_proj, config.rms_norm_eps
        self.q_norm = ShardedRMSNorm(qkv.num_heads, self.head_dim, qkv.total_num_heads,
                                     qkv.tp_rank * qkv.num_heads, 1, eps)  # fmt: skip
        kv_replicas = max(1, qkv.tp_size // qkv.total_num_kv_heads)
        self.k_norm = ShardedRMSNorm(qkv.num_kv_heads, self.head_dim, qkv.total_num_kv_heads,
                                     qkv.kv_head_start, kv_replicas, eps)  # fmt: skip

    def attention_options(self, config: PretrainedConfig, prefix: str) -> dict:
        return {"sliding_window": olmo_layer_windows(config)[layer_index(prefix)]}

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata):
        """qkv [T, q_size + 2 * kv_size] -> attention output [T, q_size] (before o_proj)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.q_norm(q), self.k_norm(k)  # [T, q_size], [T, kv_size]
        return self.attn(q, k, v, kv_cache, attn_metadata, positions, self.rotary_emb)


class Olmo2DecoderLayer(LlamaDecoderLayer):
    """Post-norm layer. The residual stream travels as in Llama (hidden states, residual):
    ``forward`` returns (normed MLP output, residual stream before the MLP's add), which the
    next layer (or the final norm) adds first."""

    attention_cls = Olmo2Attention
    small_batch_gemv = False  # the fused GEMV kernels implement Llama's pre-norm

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        h, eps = config.hidden_size, config.rms_norm_eps
        del self.input_layernorm  # no norm before attention
        self.post_attention_layernorm = OlmoRMSNorm(h, eps=eps)
        self.post_feedforward_layernorm = OlmoRMSNorm(h, eps=eps)

    def pre_attention(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states, residual [T, hidden] (residual None on the first layer) ->
        (qkv [T, q_size + 2 * kv_size], the residual stream x [T, hidden]); row-wise."""
        x = hidden_states if residual is None else residual + hidden_states  # [T, hidden]
        return self.self_attn.qkv_proj(x), x

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """attn_out [T, q_size], residual x [T, hidden] -> (normed MLP output, x + normed
        attention output), each [T, hidden]; row-wise."""
        h = residual + self.post_attention_layernorm(self.self_attn.o_proj(attn_out))
        return self.post_feedforward_layernorm(self.mlp(h)), h


class Olmo2Model(LlamaModel):
    """OLMo's final norm; OLMo 3 configs get a rotary embedding per layer type."""

    def make_norm(self, config: PretrainedConfig) -> nn.Module:
        return OlmoRMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        if config.model_type != "olmo3":
            return super().make_rotary_embs(config, num_positions)
        return rotary_per_layer_type(config, num_positions)


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 (and, as :class:`Olmo3ForCausalLM`, OLMo 3) causal LM for one pipeline stage;
    same API as LlamaForCausalLM.

    Raises:
        ValueError: OLMo 3 sliding layers without a positive ``sliding_window``, or bad
            ``layer_types``.
    """

    decoder_layer_cls = Olmo2DecoderLayer
    model_cls = Olmo2Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        if config.model_type == "olmo3":
            check_sliding_window(cls, config)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """``attention_bias`` on q/k/v and o_proj (False in released checkpoints), no MLP bias."""
        attention_bias = bool(getattr(config, "attention_bias", False))
        return attention_bias, attention_bias, False


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3: OLMo 2 with sliding-window layers and a RoPE per layer type."""


def olmo_layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Per layer its sliding window in tokens (OLMo 3's sliding layers), else None (OLMo 2:
    every layer)."""
    if config.model_type != "olmo3":
        return [None] * config.num_hidden_layers
    return gemma3_layer_windows(config)


def olmo_attention_fields(config: PretrainedConfig) -> dict:
    """``AttentionSpec`` fields: OLMo 3's distinct sliding windows (OLMo 2: none)."""
    windows = sorted({w for w in olmo_layer_windows(config) if w is not None})
    return {"sliding_windows": tuple(windows)} if windows else {}


__all__ = ["Olmo2ForCausalLM", "Olmo3ForCausalLM", "olmo_attention_fields", "olmo_layer_windows"]
