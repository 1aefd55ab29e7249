"""Qwen2 decoder (Qwen team 2024): the Llama architecture with biases on q/k/v only.

Everything else (RMSNorm, NeoX rotary, SwiGLU MLP, GQA, tied or untied embeddings) is the
same as :mod:`vllm.model_executor.models.llama`; numerics follow Hugging Face
``Qwen2ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaForCausalLM


def refuse_sliding_window(cls: type, config: PretrainedConfig) -> None:
    """A Qwen config with ``use_sliding_window`` true is refused (ValueError naming ``cls``):
    these classes run full attention only (released checkpoints leave it off)."""
    if getattr(config, "use_sliding_window", False):
        raise ValueError(
            f"{cls.__name__} with use_sliding_window=True is not supported (full attention only)"
        )


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: ``config.use_sliding_window`` is true (sliding-window attention is not
            supported).
    """

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        refuse_sliding_window(cls, config)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Qwen2 always has q/k/v biases and no o_proj or MLP bias."""
        return True, False, False
