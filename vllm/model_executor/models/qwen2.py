"""Qwen2 decoder (Qwen team 2024): the Llama architecture with biases on q/k/v only.

Everything else (RMSNorm, NeoX rotary, SwiGLU MLP, GQA, tied or untied embeddings) is the
same as :mod:`vllm.model_executor.models.llama`; numerics follow Hugging Face
``Qwen2ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: ``config.use_sliding_window`` is true (sliding-window attention is not
            supported).
    """

    def __init__(
        self,
        config: PretrainedConfig,
        pp_rank: int = 0,
        pp_size: int = 1,
        max_model_len: int | None = None,
    ) -> None:
        if getattr(config, "use_sliding_window", False):
            raise ValueError(
                "Qwen2 with use_sliding_window=True is not supported (full attention only)"
            )
        super().__init__(config, pp_rank=pp_rank, pp_size=pp_size, max_model_len=max_model_len)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Qwen2 always has q/k/v biases and no o_proj or MLP bias."""
        return True, False, False
