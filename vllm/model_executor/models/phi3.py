"""Phi-3 decoder (Abdin et al. 2024): the Llama architecture with fused checkpoint tensors.

Phi-3 checkpoints store ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` already fused, in the
row order our fused layers use (q, k, v; gate, up), so they load whole, without shards. The
128k-context variants use LongRoPE (``rope_type="longrope"``, see
:mod:`vllm.model_executor.layers.rotary_embedding`); the 4k variants have a uniform sliding
window, under which ``max_model_len`` is capped
(:func:`vllm.model_executor.models.full_attention_limit`). Numerics follow Hugging Face
``Phi3ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: ``partial_rotary_factor`` below 1 (rotary on part of each head is not
            supported).
    """

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        params = getattr(config, "rope_parameters", None) or {}
        partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1))
        if partial is not None and float(partial) != 1.0:
            raise ValueError(
                f"Phi3ForCausalLM with partial_rotary_factor={partial} is not supported "
                "(rotary over the whole head only, factor 1.0)"
            )

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Phi-3 has no projection biases."""
        return False, False, False
