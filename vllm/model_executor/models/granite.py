"""IBM Granite 3.x dense decoder, ``GraniteForCausalLM``: Llama with four scalars.

From the config, applied where transformers' ``modeling_granite.py`` applies them and as
separate multiplies (nothing is folded into the weights, so float32 results are bit-exact):

- ``embedding_multiplier``: the token embeddings are multiplied by it (first PP stage);
- ``attention_multiplier``: the attention softmax scale, instead of ``head_dim ** -0.5``
  (every backend reads it: :class:`~vllm.attention.Attention`'s ``scale``, and
  ``AttentionSpec.scale`` through :func:`granite_attention_fields` for FlashInfer's plans);
- ``residual_multiplier``: the attention output (after o_proj) and the MLP output are each
  multiplied by it before their residual add
  (:attr:`~vllm.model_executor.models.llama.LlamaDecoderLayer.residual_multiplier`, which
  the eager, piecewise and one-row GEMV paths all apply);
- ``logits_scaling``: the logits are divided by it (last PP stage, in the model's dtype
  before any float32 conversion, as transformers).

Everything else (RMSNorm, rotary, SwiGLU, GQA, biases from ``attention_bias`` /
``mlp_bias``, tied embeddings) is :mod:`vllm.model_executor.models.llama`.
"""

import math

import torch
from transformers import PretrainedConfig

from vllm.model_executor.layers.vocab_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)

_MULTIPLIERS = (
    "embedding_multiplier",
    "attention_multiplier",
    "residual_multiplier",
    "logits_scaling",
)


class GraniteEmbedding(VocabParallelEmbedding):
    """Token embedding times ``multiplier`` (a Python float, as transformers multiplies)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, multiplier: float) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.multiplier = multiplier

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.multiplier  # [T, hidden]


class GraniteAttention(LlamaAttention):
    """Llama attention with ``attention_multiplier`` as its softmax scale."""

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return float(config.attention_multiplier)


class GraniteDecoderLayer(LlamaDecoderLayer):
    """Llama layer whose attention and MLP outputs are scaled by ``residual_multiplier``."""

    attention_cls = GraniteAttention

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.residual_multiplier = float(config.residual_multiplier)


class GraniteModel(LlamaModel):
    """Llama decoder stack with the scaled embedding."""

    def make_embedding(self, config: PretrainedConfig) -> VocabParallelEmbedding:
        return GraniteEmbedding(
            config.vocab_size, config.hidden_size, float(config.embedding_multiplier)
        )


class GraniteForCausalLM(LlamaForCausalLM):
    """Granite causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: a multiplier that is not a finite number, or ``logits_scaling`` 0.
    """

    decoder_layer_cls = GraniteDecoderLayer
    model_cls = GraniteModel

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        for name in _MULTIPLIERS:
            value = getattr(config, name, None)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value):
                raise ValueError(f"GraniteForCausalLM needs a finite number {name}, got {value!r}")
        if config.logits_scaling == 0:
            raise ValueError(
                f"GraniteForCausalLM with logits_scaling={config.logits_scaling!r} is not "
                "supported (the logits are divided by it)"
            )

    def compute_logits(
        self, hidden_states: torch.Tensor, float32: bool = True
    ) -> torch.Tensor | None:
        """hidden_states [N, hidden] -> logits / ``logits_scaling`` [N, vocab_size]: the
        division in the lm_head's dtype, then float32 unless ``float32=False`` (so an eager
        step and a decode-loop graph, which keeps the model's dtype, see the same values).
        None on TP ranks other than 0."""
        logits = super().compute_logits(hidden_states, float32=False)  # [N, vocab] or None
        if logits is None:
            return None
        logits = logits / float(self.config.logits_scaling)
        return logits.float() if float32 else logits


def granite_attention_fields(config: PretrainedConfig) -> dict:
    """``AttentionSpec`` fields of a Granite config: its softmax scale
    (``attention_multiplier``)."""
    return dict(scale=float(config.attention_multiplier))


__all__ = ["GraniteForCausalLM", "granite_attention_fields"]
