"""Gemma 2 decoder (Gemma Team 2024), ``Gemma2ForCausalLM``.

Gemma 3's layout (:mod:`vllm.model_executor.models.gemma3`: GeGLU MLP, ``1 + weight``
RMSNorms, four norms per layer, embeddings times ``sqrt(hidden_size)``, softmax scale
``query_pre_attn_scalar ** -0.5``, final logits soft-capped by ``final_logit_softcapping``,
interleaved sliding-window and global layers), with Gemma 2's differences:

- no q/k norms; the attention scores instead are soft-capped,
  ``cap * tanh(scale * q.k / cap)`` with ``cap = attn_logit_softcapping`` (50 in the
  released models), before the mask and softmax, as transformers' ``eager_attention_forward``
  and FlashInfer's ``logits_soft_cap``;
- one RoPE for every layer (``rope_theta``; no local base);
- older configs without ``layer_types``: even layers slide, odd layers are global.

Numerics follow Hugging Face ``Gemma2ForCausalLM``.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.gemma3 import (
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    Gemma3Model,
    gemma3_attention_fields,
    gemma3_layer_windows,
)
from vllm.model_executor.models.llama import LlamaAttention, LlamaModel, layer_index


def _softcap(config: PretrainedConfig) -> float | None:
    """``attn_logit_softcapping`` (None or a positive float)."""
    cap = getattr(config, "attn_logit_softcapping", None)
    return None if cap is None else float(cap)


class Gemma2Attention(LlamaAttention):
    """Llama attention with Gemma 2's softmax scale, score soft-cap and the layer's sliding
    window (sliding layers)."""

    def softmax_scale(self, config: PretrainedConfig) -> float:
        """``query_pre_attn_scalar ** -0.5`` (256 ** -0.5 for Gemma 2 2B / 9B, 144 ** -0.5
        for 27B, whose head_dim is 128)."""
        return config.query_pre_attn_scalar**-0.5

    def attention_options(self, config: PretrainedConfig, prefix: str) -> dict:
        return {
            "sliding_window": gemma3_layer_windows(config)[layer_index(prefix)],
            "logits_soft_cap": _softcap(config),
        }


class Gemma2DecoderLayer(Gemma3DecoderLayer):
    """Gemma 3's layer (four norms, GeGLU) around :class:`Gemma2Attention`."""

    attention_cls = Gemma2Attention


class Gemma2Model(Gemma3Model):
    """Gemma 3's scaled embedding and final norm; Llama's single rotary embedding."""

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        return LlamaModel.make_rotary_embs(self, config, num_positions)


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2 causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: as :class:`Gemma3ForCausalLM` (an encoder variant, a sliding layer
            without a positive ``sliding_window``, bad ``layer_types``).
    """

    decoder_layer_cls = Gemma2DecoderLayer
    model_cls = Gemma2Model


def gemma2_attention_fields(config: PretrainedConfig) -> dict:
    """``AttentionSpec`` fields of a Gemma 2 config: Gemma 3's (distinct sliding windows,
    softmax scale) and the score soft-cap (what a backend must plan for)."""
    return {**gemma3_attention_fields(config), "logits_soft_cap": _softcap(config)}


__all__ = ["Gemma2ForCausalLM", "gemma2_attention_fields"]
