"""SmolLM3 decoder (Hugging Face 2025), ``SmolLM3ForCausalLM``: Llama with NoPE layers.

Some layers use no rotary position embedding. ``config.no_rope_layers`` holds one entry per
layer, as transformers reads it: 1 means the layer applies RoPE, 0 that it is a NoPE layer
(its queries and keys are attended to as projected). transformers fills the list from
``no_rope_layer_interval`` when the checkpoint has none: every ``interval``-th layer (the
4th, 8th, ... by default) is a NoPE layer. The rotary-less layers get no rotary embedding
(:meth:`SmolLM3Model.make_rotary_embs`), which every attention backend takes as "do not
rotate"; the KV cache then holds their keys unrotated, as transformers' cache does.

Sliding-window attention is not implemented for SmolLM3: a config whose ``layer_types``
marks a layer ``sliding_attention`` (transformers sets that for NoPE layers when
``use_sliding_window`` is on with a ``sliding_window``; released checkpoints leave it off) is
refused. Everything else (RMSNorm, SwiGLU, GQA, biases from ``attention_bias`` /
``mlp_bias``, tied embeddings) is :mod:`vllm.model_executor.models.llama`; numerics follow
Hugging Face ``SmolLM3ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel


def smollm3_rope_layers(config: PretrainedConfig) -> list[bool]:
    """Per layer whether it applies RoPE: ``config.no_rope_layers[i]`` (1 = RoPE, 0 = NoPE),
    else, as transformers derives it, every ``no_rope_layer_interval``-th layer NoPE.

    Raises:
        ValueError: ``no_rope_layers`` shorter than the layer count, or with an entry other
            than 0 / 1, or an interval below 1.
    """
    n = config.num_hidden_layers
    flags = getattr(config, "no_rope_layers", None)
    if flags is None:
        interval = getattr(config, "no_rope_layer_interval", 4)
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"SmolLM3 no_rope_layer_interval must be >= 1, got {interval!r}")
        return [(i + 1) % interval != 0 for i in range(n)]
    flags = list(flags)
    if len(flags) < n or any(f not in (0, 1) for f in flags):
        raise ValueError(
            f"SmolLM3 no_rope_layers must hold 0 (NoPE) or 1 (RoPE) for each of the {n} "
            f"layers, got {flags}"
        )
    return [bool(f) for f in flags[:n]]


class SmolLM3Model(LlamaModel):
    """Llama decoder stack whose NoPE layers get no rotary embedding."""

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        """Llama's shared rotary embedding on the RoPE layers, None on the NoPE ones."""
        shared = super().make_rotary_embs(config, num_positions)
        return [emb if rope else None for emb, rope in zip(shared, smollm3_rope_layers(config))]


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: a layer that transformers runs with a sliding window (``layer_types``
            with ``sliding_attention``) or any layer type other than ``full_attention``,
            or a bad ``no_rope_layers`` (see :func:`smollm3_rope_layers`).
    """

    model_cls = SmolLM3Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        smollm3_rope_layers(config)
        types = getattr(config, "layer_types", None) or []
        others = sorted({t for t in types if t != "full_attention"})
        if others:
            raise ValueError(
                f"SmolLM3ForCausalLM with layer_types {others} is not supported (full "
                f"attention only; use_sliding_window={getattr(config, 'use_sliding_window', None)}"
                f", sliding_window={getattr(config, 'sliding_window', None)})"
            )


__all__ = ["SmolLM3ForCausalLM", "smollm3_rope_layers"]
