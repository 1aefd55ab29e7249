"""Qwen3 decoder (Qwen team 2025): Llama with a per-head RMSNorm on queries and keys.

Each query and key head vector is RMS-normalised (its own learned ``q_norm`` / ``k_norm``
weight of size ``head_dim``) after the projection and before the rotary embedding; there are
no q/k/v biases and ``head_dim`` is given by the config (it need not be hidden / heads).
Everything else is :mod:`vllm.model_executor.models.llama`; numerics follow Hugging Face
``Qwen3ForCausalLM``.
"""

import torch
from transformers import PretrainedConfig

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
)
from vllm.model_executor.models.qwen2 import refuse_sliding_window


class Qwen3Attention(LlamaAttention):
    """:class:`LlamaAttention` with ``q_norm`` / ``k_norm`` (RMSNorm over ``head_dim``)."""

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata):
        """qkv [T, q_size + 2 * kv_size] -> attention output [T, q_size] (before o_proj)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        num_tokens = q.shape[0]
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(num_tokens, self.q_size)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(num_tokens, self.kv_size)
        return self.attn(q, k, v, kv_cache, attn_metadata, positions, self.rotary_emb)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """Llama decoder layer with :class:`Qwen3Attention`."""

    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: ``config.use_sliding_window`` is true and some layer slides (see
            :func:`~vllm.model_executor.models.qwen2.refuse_sliding_window`; released
            checkpoints leave it off).
    """

    decoder_layer_cls = Qwen3DecoderLayer

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        refuse_sliding_window(cls, config)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """``attention_bias`` on q/k/v and o_proj (False in released checkpoints), no MLP bias."""
        attention_bias = bool(getattr(config, "attention_bias", False))
        return attention_bias, attention_bias, False
