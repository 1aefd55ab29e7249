"""Qwen2 decoder (Qwen team 2024): the Llama architecture with biases on q/k/v only.

Everything else (RMSNorm, NeoX rotary, SwiGLU MLP, GQA, tied or untied embeddings) is the
same as :mod:`vllm.model_executor.models.llama`; numerics follow Hugging Face
``Qwen2ForCausalLM``.
"""

from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaForCausalLM


def refuse_sliding_window(cls: type, config: PretrainedConfig) -> None:
    """A Qwen config under which transformers runs some layer with a sliding window is
    refused (ValueError naming ``cls``): these classes run full attention only (released
    checkpoints leave ``use_sliding_window`` off). Qwen2 and Qwen3 slide only the layers
    that ``config.layer_types`` marks ``sliding_attention`` (transformers sets it from
    ``use_sliding_window``, ``sliding_window`` and ``max_window_layers``), so
    ``use_sliding_window`` with no such layer is full attention and accepted; without
    ``layer_types`` (Qwen3-MoE, older transformers) every layer slides when
    ``use_sliding_window`` is set with a window."""
    if not getattr(config, "use_sliding_window", False):
        return
    types = getattr(config, "layer_types", None)
    if getattr(config, "model_type", None) in ("qwen2", "qwen3") and types is not None:
        sliding = "sliding_attention" in types
    else:
        sliding = getattr(config, "sliding_window", None) is not None
    if sliding:
        raise ValueError(
            f"{cls.__name__} with use_sliding_window=True is not supported (full attention "
            "only; layers that transformers runs with a sliding window)"
        )


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 causal LM for one pipeline stage; same signature and API as LlamaForCausalLM.

    Raises:
        ValueError: ``config.use_sliding_window`` is true and some layer slides (see
            :func:`refuse_sliding_window`; sliding-window attention is not supported).
    """

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        refuse_sliding_window(cls, config)

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """Qwen2 always has q/k/v biases and no o_proj or MLP bias."""
        return True, False, False
