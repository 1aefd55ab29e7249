"""Registry of the model architectures the engine can run.

``config.architectures`` (from the checkpoint's config.json) picks the class, as in HF.
"""

import importlib

from torch import nn

# architecture name -> (module under vllm.model_executor.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
}

# config.model_type -> architecture, for configs without `architectures` (GGUF-derived ones)
_MODEL_TYPE_TO_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


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


def get_model_class(architectures: list[str]) -> type[nn.Module]:
    """Model class for ``architectures`` (see :meth:`ModelRegistry.resolve_model_cls`)."""
    return ModelRegistry.resolve_model_cls(architectures)[0]


def architectures_of(config) -> list[str]:
    """``config.architectures``, or the one implied by ``config.model_type`` when unset."""
    archs = list(getattr(config, "architectures", None) or [])
    if not archs and getattr(config, "model_type", None) in _MODEL_TYPE_TO_ARCH:
        archs = [_MODEL_TYPE_TO_ARCH[config.model_type]]
    return archs


__all__ = ["ModelRegistry", "architectures_of", "get_model_class"]
