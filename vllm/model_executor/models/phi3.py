"""Phi-3 decoder (Abdin et al. 2024): the Llama architecture with fused checkpoint tensors.

Phi-3 checkpoints store ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` already fused, in the
row order our fused layers use (q, k, v; gate, up), so they load whole, without shards. The
128k-context variants use LongRoPE (``rope_type="longrope"``, see
:mod:`vllm.model_executor.layers.rotary_embedding`); the 4k variants have a uniform sliding
window, under which ``max_model_len`` is capped
(:func:`vllm.model_executor.models.full_attention_limit`). Phi-4-mini (the same class) rotates
only the first ``int(head_dim * partial_rotary_factor)`` channels of each head (0.75: 96 of
128), its LongRoPE factor lists one per rotated pair. Numerics follow Hugging Face
``Phi3ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.layers.rotary_embedding import partial_rotary_dim
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel


def _head_dim(config: PretrainedConfig) -> int:
    """``config.head_dim``, else hidden_size // num_attention_heads (as transformers)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Phi3Model(LlamaModel):
    """Llama's decoder stack with Phi-3's partial rotary (``partial_rotary_factor``)."""

    def rotary_dim(self, config: PretrainedConfig, head_dim: int) -> int:
        """``int(head_dim * partial_rotary_factor)`` (:func:`partial_rotary_dim`)."""
        return partial_rotary_dim(config, head_dim)


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: a ``partial_rotary_factor`` outside (0, 1], or one whose rotary_dim
            (``int(head_dim * factor)``) is odd or 0.
    """

    model_cls = Phi3Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        partial_rotary_dim(config, _head_dim(config))

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Phi-3 has no projection biases."""
        return False, False, False
