"""Mistral decoder (Jiang et al. 2023): the Llama architecture without biases.

The released checkpoints differ from Llama only in their config (GQA, rope theta, a
``sliding_window`` on v0.1). Sliding-window attention equals full attention while the whole
sequence fits in the window, so the engine caps ``max_model_len`` at the window
(:func:`vllm.model_executor.models.full_attention_limit`); numerics follow Hugging Face
``MistralForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral causal LM for one pipeline stage; same signature and API as LlamaForCausalLM."""

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Mistral has no projection biases."""
        return False, False, False
