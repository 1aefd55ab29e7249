"""GLM-4-0414 decoder (Zhipu AI / THUDM 2025; GLM-4-9B-0414, GLM-4-32B-0414),
``Glm4ForCausalLM``.

Llama's projections with GLM-4's differences, following transformers' ``Glm4DecoderLayer``,
``Glm4Attention`` and ``apply_rotary_pos_emb``:

- four RMSNorms per layer: besides the input and pre-MLP norms (``input_layernorm``,
  ``post_attention_layernorm``), the attention output is normed
  (``post_self_attn_layernorm``) before its residual add and the MLP output
  (``post_mlp_layernorm``) before its::

      h = x + post_self_attn_ln(attn(input_ln(x)))
      out = h + post_mlp_ln(mlp(post_attention_ln(h)))

  The norms are Llama's (the normalised input rounded to the dtype, then times the weight);
- the checkpoint stores ``mlp.gate_up_proj`` fused (gate rows, then up rows, as
  transformers' ``Glm4MLP`` chunks it), loaded whole like Phi-3's;
- q/k/v biases (``attention_bias``, True in the released models), no o_proj bias;
- partial, interleaved rotary: the first ``int(head_dim * partial_rotary_factor)``
  channels of each head (0.5: 64 of 128) rotate as pairs of adjacent channels (GPT-J
  style; :class:`~vllm.model_executor.layers.rotary_embedding.RotaryEmbedding` with
  ``interleaved=True``), the rest pass through.

The residual stream travels as in Llama (the add fused into the next norm), as Gemma 3's
four-norm layer does. Numerics follow Hugging Face ``Glm4ForCausalLM``.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import (
    RotaryEmbedding,
    get_rope_parameters,
    partial_rotary_dim,
)
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


def glm_head_dim(config: PretrainedConfig) -> int:
    """``config.head_dim``, else hidden_size // num_attention_heads (as transformers)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def glm_rotary_emb(config: PretrainedConfig, num_positions: int, interleaved: bool):
    """One rotary embedding for every layer of a GLM config: the first
    ``int(head_dim * partial_rotary_factor)`` channels of each head rotate
    (:func:`partial_rotary_dim`), as pairs (``interleaved``, GLM-4) or halves (GLM-4.5),
    with tables of ``num_positions`` rows."""
    head_dim = glm_head_dim(config)
    return RotaryEmbedding(
        head_dim,
        partial_rotary_dim(config, head_dim),
        config.max_position_embeddings,
        get_rope_parameters(config),
        num_positions=num_positions,
        interleaved=interleaved,
    )


class Glm4DecoderLayer(LlamaDecoderLayer):
    """GLM-4 layer with four norms (module docstring). ``forward`` returns (normed MLP output,
    residual stream before the MLP's add), which the next layer's input norm (or the final
    norm) adds first."""

    small_batch_gemv = False  # the fused GEMV kernels implement Llama's two-norm layer

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.post_self_attn_layernorm = RMSNorm(h, eps=eps)
        self.post_mlp_layernorm = RMSNorm(h, eps=eps)

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """attn_out [T, q_size], residual [T, hidden] -> (normed MLP output, residual stream
        x + normed attention output), each [T, hidden]; row-wise."""
        hidden_states = self.self_attn.o_proj(attn_out)  # [T, hidden]
        hidden_states = self.post_self_attn_layernorm(hidden_states)  # [T, hidden]
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.post_mlp_layernorm(self.mlp(hidden_states)), residual  # [T, hidden] each


class Glm4Model(LlamaModel):
    """Llama's decoder stack with GLM-4's partial, interleaved rotary."""

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        return [glm_rotary_emb(config, num_positions, True)] * config.num_hidden_layers


class Glm4ForCausalLM(LlamaForCausalLM):
    """GLM-4-0414 causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: a ``partial_rotary_factor`` outside (0, 1] or whose rotary_dim is odd
            or 0 (:func:`partial_rotary_dim`).
    """

    decoder_layer_cls = Glm4DecoderLayer
    model_cls = Glm4Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        partial_rotary_dim(config, glm_head_dim(config))

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """``attention_bias`` on q/k/v only (transformers' ``Glm4Attention``: o_proj has
        none), no MLP bias."""
        return bool(getattr(config, "attention_bias", False)), False, False


__all__ = ["Glm4ForCausalLM", "glm_head_dim", "glm_rotary_emb"]
