"""A compact, clean-room fork of the vLLM V0 engine (see README.md).

Public names are imported lazily so that torch-free parts (``vllm.core``,
``vllm.sequence``) can be used without importing torch.
"""

from vllm.version import __version__

_LAZY = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "BeamSearchParams": "vllm.sampling_params",
    "RequestOutputKind": "vllm.sampling_params",
    "EngineArgs": "vllm.engine.arg_utils",
    "LLMEngine": "vllm.engine.llm_engine",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "PoolingParams": "vllm.pooling_params",
    "PoolingRequestOutput": "vllm.outputs",
    "EmbeddingRequestOutput": "vllm.outputs",
    "ScoringRequestOutput": "vllm.outputs",
    "AsyncLLMEngine": "vllm.engine.async_llm_engine",
    "AsyncEngineArgs": "vllm.engine.arg_utils",
    "TextPrompt": "vllm.inputs",
    "TokensPrompt": "vllm.inputs",
    "PromptType": "vllm.inputs",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")
