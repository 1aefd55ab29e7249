"""Gemma 3 text decoder (Gemma Team 2025), ``Gemma3ForCausalLM``.

Built on :mod:`vllm.model_executor.models.llama`'s pieces, with Gemma's differences:

- GeGLU MLP (``gelu_pytorch_tanh``) and RMSNorm scaled by ``1 + weight``
  (:class:`~vllm.model_executor.layers.layernorm.GemmaRMSNorm`), four norms per layer: the
  attention and MLP outputs are normed before they join the residual stream;
- token embeddings multiplied by ``sqrt(hidden_size)`` (rounded to the model dtype first,
  as transformers does);
- per-head RMSNorm on queries and keys (as Qwen3), softmax scale
  ``query_pre_attn_scalar ** -0.5``, final logits soft-capped by
  ``final_logit_softcapping`` when set. ``attn_logit_softcapping`` is ignored: Gemma 3
  replaced Gemma 2's attention soft-cap by the q/k norms, and transformers' Gemma 3 (like
  upstream vLLM's) applies no cap to attention scores whatever the config says;
- interleaved layers: ``sliding_attention`` layers attend to the last ``sliding_window``
  positions and rotate with their own RoPE base (``rope_local_base_freq``; transformers 5:
  ``rope_parameters["sliding_attention"]``), ``full_attention`` layers attend to the whole
  context with the global RoPE (and its scaling). The window is a property of each
  :class:`~vllm.attention.Attention` layer, applied by the attention backend.

The KV cache keeps every position of every layer (a sliding layer's old keys are masked,
not evicted). Numerics follow Hugging Face ``Gemma3ForCausalLM``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from vllm.model_executor.layers.vocab_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    layer_index,
)
from vllm.model_executor.models.qwen3 import Qwen3Attention

SLIDING, FULL = "sliding_attention", "full_attention"


def gemma3_layer_types(config: PretrainedConfig) -> list[str]:
    """Per layer ``"sliding_attention"`` or ``"full_attention"``: ``config.layer_types``
    (transformers >= 4.53), else every ``sliding_window_pattern``-th layer global (older
    configs; default 6 for Gemma 3, 2 for Gemma 2, whose even layers slide).

    Raises:
        ValueError: a layer type other than those two, or a list of the wrong length.
    """
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if not types:
        pattern = getattr(config, "sliding_window_pattern", None) or getattr(
            config, "_sliding_window_pattern", 2 if config.model_type == "gemma2" else 6
        )
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    types = list(types)
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ValueError(
            f"Gemma layer_types must list {n} entries of {[SLIDING, FULL]}, got {types}"
        )
    return types


def gemma3_layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Per layer its sliding window in tokens (``config.sliding_window``), None for global
    layers (Gemma 2 and 3)."""
    window = getattr(config, "sliding_window", None)
    return [window if t == SLIDING else None for t in gemma3_layer_types(config)]


def check_sliding_window(cls: type, config: PretrainedConfig) -> None:
    """Refuse (ValueError naming ``cls``) a config with sliding layers (``layer_types``)
    and no positive ``sliding_window``, or with bad ``layer_types``."""
    window = getattr(config, "sliding_window", None)
    if SLIDING in gemma3_layer_types(config) and not (window or 0) >= 1:
        raise ValueError(f"{cls.__name__}'s sliding layers need sliding_window >= 1, got {window}")


def gemma3_rope_parameters(config: PretrainedConfig, layer_type: str) -> dict:
    """Rope settings of one layer type (``rope_theta``, ``rope_type``, scaling keys)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        merged = dict(params[layer_type])
        merged.setdefault("rope_type", merged.get("type", "default"))
        return merged
    if layer_type == SLIDING:  # older configs: a plain base for the local layers
        return {"rope_type": "default", "rope_theta": config.rope_local_base_freq}
    return get_rope_parameters(config)


def rotary_per_layer_type(config: PretrainedConfig, num_positions: int) -> list[RotaryEmbedding]:
    """The rotary embedding of each layer: one instance per layer type
    (:func:`gemma3_layer_types`), with that type's settings (:func:`gemma3_rope_parameters`)
    and tables of ``num_positions`` rows; whole heads rotate (Gemma 3, OLMo 3)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    types = gemma3_layer_types(config)
    by_type = {
        t: RotaryEmbedding(
            head_dim,
            head_dim,
            config.max_position_embeddings,
            gemma3_rope_parameters(config, t),
            num_positions=num_positions,
        )
        for t in sorted(set(types))
    }
    return [by_type[t] for t in types]


class Gemma3Embedding(VocabParallelEmbedding):
    """Token embedding times ``sqrt(hidden_size)``, the factor rounded to the weight dtype
    (bf16: sqrt(3072) = 55.4256 becomes 55.5), as transformers."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.register_buffer("embed_scale", torch.tensor(embedding_dim**0.5, dtype=torch.float32),
                             persistent=False)  # fmt: skip

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        scale = self.embed_scale.to(self.weight.dtype)  # a 0-d device tensor
        return super().forward(input_ids) * scale  # [T, hidden]


class Gemma3Attention(Qwen3Attention):
    """Attention with Gemma q/k norms, ``query_pre_attn_scalar ** -0.5`` scale and the
    layer's sliding window (sliding layers); no score soft-cap (module docstring)."""

    def __init__(self, config: PretrainedConfig, *args, prefix: str, **kwargs) -> None:
        super().__init__(config, *args, prefix=prefix, **kwargs)
        eps = config.rms_norm_eps
        self.q_norm = GemmaRMSNorm(self.head_dim, eps=eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps=eps)

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return config.query_pre_attn_scalar**-0.5

    def attention_options(self, config: PretrainedConfig, prefix: str) -> dict:
        return {"sliding_window": gemma3_layer_windows(config)[layer_index(prefix)]}


class Gemma3DecoderLayer(LlamaDecoderLayer):
    """Gemma 3 layer: ``x + post_ff(mlp(pre_ff(x + post_attn(attn(input_ln(x))))))``.

    The residual travels next to the hidden states as in Llama (the add fused into the next
    norm): ``forward`` returns (normed MLP output, residual before it).
    """

    attention_cls = Gemma3Attention
    small_batch_gemv = False  # the fused GEMV kernels implement Llama's norm and SiLU

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps=eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps=eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps=eps)

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        """GeGLU: ``down(gelu_tanh(gate(x)) * up(x))``, no biases."""
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        return LlamaMLP(config.hidden_size, config.intermediate_size, act, bias=False)

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """attn_out [T, q_size], residual [T, hidden] -> (post-norm MLP output, residual
        before the MLP), each [T, hidden]; row-wise."""
        hidden_states = self.self_attn.o_proj(attn_out)  # [T, hidden]
        hidden_states = self.post_attention_layernorm(hidden_states)  # [T, hidden]
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return hidden_states, residual


class Gemma3Model(LlamaModel):
    """Scaled embedding, Gemma final norm, one rotary embedding per layer type."""

    def make_embedding(self, config: PretrainedConfig) -> nn.Module:
        return Gemma3Embedding(config.vocab_size, config.hidden_size)

    def make_norm(self, config: PretrainedConfig) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding]:
        return rotary_per_layer_type(config, num_positions)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: ``use_bidirectional_attention`` (an encoder variant), a sliding layer
            without a positive ``sliding_window``, or bad ``layer_types``.
    """

    decoder_layer_cls = Gemma3DecoderLayer
    model_cls = Gemma3Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(
                f"{cls.__name__} with use_bidirectional_attention=True is not supported "
                "(causal attention only)"
            )
        check_sliding_window(cls, config)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """``attention_bias`` on q/k/v and o_proj (False in released checkpoints), no MLP bias."""
        attention_bias = bool(getattr(config, "attention_bias", False))
        return attention_bias, attention_bias, False

    def compute_logits(
        self, hidden_states: torch.Tensor, float32: bool = True
    ) -> torch.Tensor | None:
        """hidden_states [N, hidden] -> logits [N, vocab_size] float32, soft-capped
        ``cap * tanh(logits / cap)`` when ``final_logit_softcapping`` is set. Always
        float32 (``float32`` is accepted for the interface): the cap is applied there.
        Under tensor parallelism the TP ranks other than 0 get None (no logits to cap)."""
        logits = super().compute_logits(hidden_states)  # [N, vocab_size], or None
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None and logits is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def gemma3_attention_fields(config: PretrainedConfig) -> dict:
    """``AttentionSpec`` fields of a Gemma 3 config: its distinct sliding windows and softmax
    scale (what a backend must plan for); no score cap, as ``attn_logit_softcapping`` is
    ignored (module docstring)."""
    windows = sorted({w for w in gemma3_layer_windows(config) if w is not None})
    return dict(
        sliding_windows=tuple(windows),
        scale=config.query_pre_attn_scalar**-0.5,
    )


__all__ = [
    "Gemma3ForCausalLM",
    "check_sliding_window",
    "gemma3_attention_fields",
    "gemma3_layer_windows",
    "rotary_per_layer_type",
]
