"""Registry of the model architectures the engine can run.

``config.architectures`` (from the checkpoint's config.json) picks the class, as in HF.
"""

import importlib

from torch import nn

# architecture name -> (module under vllm.model_executor.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "MistralForCausalLM": ("mistral", "MistralForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "Olmo2ForCausalLM"),
    "Olmo3ForCausalLM": ("olmo2", "Olmo3ForCausalLM"),
    "SmolLM3ForCausalLM": ("smollm3", "SmolLM3ForCausalLM"),
    "Glm4ForCausalLM": ("glm4", "Glm4ForCausalLM"),
    "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
    # decoder stacks without an LM head (embedding checkpoints such as e5-mistral): served
    # with --task embed by the causal LM class, whose lm_head then ties to the embedding
    "LlamaModel": ("llama", "LlamaForCausalLM"),
    "MistralModel": ("mistral", "MistralForCausalLM"),
    "Qwen2Model": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3Model": ("qwen3", "Qwen3ForCausalLM"),
}
HEADLESS_ARCHS = ("LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model")

# config.model_type -> architecture, for configs without `architectures` (GGUF-derived ones)
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}

# multi-head latent attention: the head size and softmax scale are not the config's
# head_dim (vllm/model_executor/models/deepseek_mla.py)
_MLA_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")

# architectures whose GGUF files load (gguf_loader's tensor names; checked against
# transformers on tiny files); other architectures load from Hugging Face directories only
GGUF_ARCHS = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)

# model types whose every layer attends over a window of ``config.sliding_window`` tokens
_UNIFORM_WINDOW_TYPES = ("mistral", "phi3", "mixtral")


class ModelRegistry:
    """Maps architecture names to model classes (imported on first use)."""

    @staticmethod
    def get_supported_archs() -> list[str]:
        return list(_MODELS)

    @staticmethod
    def resolve_model_cls(architectures: list[str]) -> tuple[type[nn.Module], str]:
        """First supported entry of ``architectures`` -> (class, its name).

        Raises:
            ValueError: none supported; the message lists the supported architectures.
        """
        for arch in architectures or []:
            if arch in _MODELS:
                module_name, cls_name = _MODELS[arch]
                module = importlib.import_module(f"vllm.model_executor.models.{module_name}")
                return getattr(module, cls_name), arch
        raise ValueError(
            f"Model architectures {list(architectures or [])} are not supported for now. "
            f"Supported architectures: {ModelRegistry.get_supported_archs()}"
        )


def is_headless(config) -> bool:
    """Whether the checkpoint is a decoder stack without an LM head (``LlamaModel`` ...):
    it serves embeddings only, and its tensors lack the ``model.`` prefix."""
    try:
        return ModelRegistry.resolve_model_cls(architectures_of(config))[1] in HEADLESS_ARCHS
    except ValueError:
        return False


def get_model_class(architectures: list[str]) -> type[nn.Module]:
    """Model class for ``architectures`` (see :meth:`ModelRegistry.resolve_model_cls`)."""
    return ModelRegistry.resolve_model_cls(architectures)[0]


def architectures_of(config) -> list[str]:
    """``config.architectures``, or the one implied by ``config.model_type`` when unset."""
    archs = list(getattr(config, "architectures", None) or [])
    if not archs and getattr(config, "model_type", None) in _MODEL_TYPE_TO_ARCH:
        archs = [_MODEL_TYPE_TO_ARCH[config.model_type]]
    return archs


def full_attention_limit(config, disable_sliding_window: bool = False) -> int | None:
    """Longest context (tokens) over which the model's attention is plain causal attention.

    A model whose every layer has a sliding window of W tokens (Mistral v0.1, Phi-3 4k)
    attends to the whole sequence as long as it holds at most W tokens; ``ModelConfig`` caps
    ``max_model_len`` there. With ``disable_sliding_window`` (upstream's switch) a model that
    mixes windowed and global layers (Gemma 2 and 3, OLMo 3) is capped too, at its smallest
    window. None: no such limit.
    """
    model_type = getattr(config, "model_type", None)
    if model_type in _UNIFORM_WINDOW_TYPES:
        window = getattr(config, "sliding_window", None)
        return int(window) if window else None
    if disable_sliding_window and model_type in ("gemma2", "gemma3_text", "olmo3"):
        from vllm.model_executor.models.gemma3 import gemma3_layer_windows

        windows = [w for w in gemma3_layer_windows(config) if w]
        return int(min(windows)) if windows else None
    return None


# RoPE types whose max_position_embeddings already counts the scaling (upstream's rule)
_SCALING_COUNTED_ROPE_TYPES = ("default", "llama3", "longrope", "su")


def context_limit(config) -> int | None:
    """The context (tokens) the config was made for, the default ``max_model_len``, derived
    as upstream derives it: ``max_position_embeddings``, times the ``factor`` of a RoPE
    scaling that stretches positions (linear: the config keeps the pre-scaling context);
    with yarn, ``original_max_position_embeddings`` times its factor. The llama3 and
    longrope scalings, and Gemma 3 configs, count theirs in ``max_position_embeddings``
    already. None: the config sets no limit."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None:
        return None
    if "gemma3" in (getattr(config, "model_type", None) or ""):
        return int(limit)
    from vllm.model_executor.layers.rotary_embedding import get_rope_parameters
    from vllm.model_executor.layers.yarn_rope import yarn_context_length

    yarn = yarn_context_length(config)
    if yarn is not None:
        return yarn

    params = get_rope_parameters(config)
    if params["rope_type"] in _SCALING_COUNTED_ROPE_TYPES:
        return int(limit)
    return int(limit * float(params.get("factor") or 1.0))


def _is_mla(config) -> bool:
    return any(arch in _MLA_ARCHS for arch in architectures_of(config))


def attention_head_size(config) -> int:
    """Channels per head of the attention layers and the KV cache: ``head_dim``, else
    hidden_size // num_attention_heads; for the MLA families (DeepSeek-V2 / V3, whose
    ``head_dim`` is the rotary part) :func:`~vllm.model_executor.models.deepseek_mla.
    mla_head_size`."""
    if _is_mla(config):
        from vllm.model_executor.models.deepseek_mla import mla_head_size

        return mla_head_size(config)
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def attention_fields(config) -> dict:
    """``AttentionSpec`` fields beyond the shapes that the model's attention layers need:
    ``sliding_windows`` (the distinct per-layer windows, tokens), ``scale`` (softmax scale
    when not head_size ** -0.5) and ``logits_soft_cap``. Empty for every family but Gemma 2
    and 3, OLMo 3 (windows), Granite (``attention_multiplier``) and the MLA families
    (their scale, :func:`~vllm.model_executor.models.deepseek_mla.mla_softmax_scale`:
    ``head_size`` may be padded and YaRN may adjust it); a uniform window is
    handled by capping max_model_len, see :func:`full_attention_limit`. The model runner
    checks every attention layer against them
    (``vllm.attention.layer.check_layers_match_spec``)."""
    if _is_mla(config):
        from vllm.model_executor.models.deepseek_mla import mla_softmax_scale

        return {"scale": mla_softmax_scale(config)}
    model_type = getattr(config, "model_type", None)
    if model_type == "gemma2":
        from vllm.model_executor.models.gemma2 import gemma2_attention_fields

        return gemma2_attention_fields(config)
    if model_type == "gemma3_text":
        from vllm.model_executor.models.gemma3 import gemma3_attention_fields

        return gemma3_attention_fields(config)
    if model_type == "olmo3":
        from vllm.model_executor.models.olmo2 import olmo_attention_fields

        return olmo_attention_fields(config)
    if model_type == "granite":
        from vllm.model_executor.models.granite import granite_attention_fields

        return granite_attention_fields(config)
    return {}


__all__ = [
    "GGUF_ARCHS",
    "ModelRegistry",
    "architectures_of",
    "attention_fields",
    "attention_head_size",
    "context_limit",
    "full_attention_limit",
    "get_model_class",
]
