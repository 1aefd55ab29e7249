"""Engine configuration: a few validated dataclasses composed into one ``EngineConfig``.

Every bad value or combination fails here, in :meth:`EngineConfig.verify`, before any
weight is loaded, process spawned or device memory touched. Names and defaults follow
upstream vLLM's V0 engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from vllm.sampling_params import LOGPROBS_MODES
from vllm.transformers_utils.hf_config import apply_hf_overrides, load_hf_config

logger = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float")
_LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy", "sim")
_DEVICES = ("auto", "cuda", "cpu")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class DeviceConfig:
    """Which device runs the model: "cuda" or "cpu" ("auto" picks CUDA when present), and
    the attention backend asked for (``--attention-backend``, any case; None: the
    VLLM_ATTENTION_BACKEND variable or the default rule, vllm/attention/selector.py)."""

    device: str = "auto"
    attention_backend: str | None = None

    def __post_init__(self) -> None:
        if self.device not in _DEVICES:
            raise ValueError(f"device must be one of {list(_DEVICES)}, got {self.device!r}.")
        if self.device == "auto":
            self.device = "cuda" if _cuda_available() else "cpu"
        elif self.device == "cuda" and not _cuda_available():
            raise ValueError("device='cuda' was requested but torch.cuda.is_available() is False.")

    @property
    def device_type(self) -> str:
        return self.device


@dataclass
class ModelConfig:
    """The model: where its weights are, its Hugging Face config, dtype and context length.

    Args:
        model: a Hugging Face directory (config.json + *.safetensors) or a single .gguf file.
        tokenizer: tokenizer path (defaults to ``model``).
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "float16", "bfloat16".
        max_model_len: context length (prompt + output) in tokens; default from the config.
        max_logprobs: the most ``logprobs`` / ``prompt_logprobs`` a request may ask for
            (upstream's default 20, OpenAI's ``top_logprobs`` limit); -1 for no limit below
            the vocabulary size.
        logprobs_mode: what a sample's logprobs report, one of
            :data:`vllm.sampling_params.LOGPROBS_MODES` (upstream's ``--logprobs-mode``):
            "raw_logprobs" (default) / "raw_logits" from the model's logits before the
            sampler edits them, "processed_logprobs" / "processed_logits" from the logits
            the token is drawn from (vllm/model_executor/layers/sampler.py). Prompt
            logprobs are raw logprobs in every mode.
        load_format: "auto" (gguf for a .gguf file, else safetensors), "safetensors",
            "gguf", "dummy" (random weights seeded by parameter name, for benchmarks) or
            "sim" (the pipeline simulator's stand-in forward that only waits).
        model_loader_extra_config: options of the load format, a dict or its JSON text;
            "sim" reads ``step_ms``, ``per_row_us``, ``per_token_us``
            (vllm/model_executor/model_loader/sim_model.py).
        quantization: None, or "fp8": the decoder's projections quantized to
            float8_e4m3fn after loading (vllm/model_executor/layers/fp8.py; the engine
            arguments refuse it for a .gguf file, vllm/engine/compat_args.py). A checkpoint
            already in fp8 (vllm/model_executor/layers/fp8_checkpoint.py) sets it to "fp8"
            and ``checkpoint_quantization`` to its format; "compressed-tensors" or
            "fbgemm_fp8" may name that format explicitly. One without fp8 kernels here
            (block-wise scales, mixture of experts) sets ``checkpoint_dequantized`` (its
            method and why) and loads dequantized to the model's dtype
            (vllm/model_executor/layers/fp8_dequant.py); "fp8" then quantizes the
            dequantized projections per row again. With load_format "dummy" such a
            checkpoint's config sets "fp8" alone: the random weights are quantized on load,
            so a benchmark runs fp8 layers as the checkpoint would (the config of a
            quantization not loaded here leaves dummy weights in the model's dtype). A
            compressed-tensors checkpoint quantizing only the KV cache (a
            ``kv_cache_scheme``, no ``config_groups``) keeps its weights as stored (None,
            which "compressed-tensors" also gives; "fp8" quantizes them on load) and loads
            its KV-cache scales. A GPTQ or AWQ checkpoint
            (vllm/model_executor/layers/int_checkpoint.py; "gptq" / "awq" may name it)
            sets ``checkpoint_int`` and loads dequantized to the model's dtype
            (vllm/model_executor/layers/int_dequant.py): None, or "fp8" to quantize the
            dequantized projections per row.
        tokenizer_mode: how the tokenizer is loaded ("auto" or "slow"; see
            vllm/engine/compat_args.py).
        trust_remote_code: let transformers run the checkpoint's own config and tokenizer
            code (``auto_map``); the model classes are always this engine's.
        generation_config: where the model's ``generation_config.json`` comes from:
            "auto" (the model directory), "vllm" (ignored) or a directory; see
            vllm/transformers_utils/generation_config.py.
        override_generation_config: generation-config fields (``temperature``, ``top_p``,
            ``top_k``, ``min_p``, ``repetition_penalty``, ``max_new_tokens``) that replace
            or add to the file's, a dict or its JSON text (upstream's flag).
        hf_overrides: Hugging Face config attributes to set after loading it, a dict or its
            JSON text (a dict value updates a nested config such as ``text_config``).
        hf_config_path: a Hugging Face directory (or a .gguf file) to read the config from
            instead of ``model`` (upstream's ``--hf-config-path``): for a GGUF file whose
            metadata transformers cannot turn into a config, or an incomplete one, the
            original model's directory; the weights still come from ``model``.
        disable_sliding_window: upstream's switch: cap max_model_len at the model's
            smallest sliding window (within it sliding-window attention is full attention);
            no change for models without one, nor for those whose every layer has one
            (capped anyway).
        use_async_output_proc: ``LLMEngine.step`` turns a step's tokens into text and
            RequestOutputs while the device runs the next step (upstream V0's name; see
            vllm/engine/step_report.py). Resolved by ``EngineArgs`` from
            ``--disable-async-output-proc``.

    Raises:
        ValueError: missing path (model or hf_config_path), unknown dtype, load format or
            logprobs_mode,
            max_logprobs below -1, a
            generation_config directory without generation_config.json, an
            unsupported architecture
            (or one without GGUF support given as a .gguf file), max_model_len above
            the model's context limit (``context_limit``: max_position_embeddings, times a
            linear RoPE scaling's factor; with yarn scaling original_max_position_embeddings
            times its factor) or above a uniform sliding window (Mistral v0.1), or
            with disable_sliding_window above the smallest window; an unknown
            quantization; a safetensors checkpoint whose ``quantization_config`` is not
            a format this engine loads (int8, GPTQ with 3 bits, AWQ's gemv packing, ...;
            see fp8_checkpoint.checkpoint_fp8_method and
            int_checkpoint.checkpoint_int_method), or that another quantization names.
    """

    model: str
    tokenizer: str | None = None
    dtype: Any = "auto"  # a name on input, the resolved torch.dtype after __post_init__
    seed: int = 0
    max_model_len: int | None = None
    max_logprobs: int = 20
    logprobs_mode: str = LOGPROBS_MODES[0]
    load_format: str = "auto"
    quantization: str | None = None
    skip_tokenizer_init: bool = False
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    device: str = "cpu"
    model_loader_extra_config: Any = None
    use_async_output_proc: bool = False
    generation_config: str = "auto"
    override_generation_config: Any = None
    hf_overrides: Any = None
    hf_config_path: str | None = None
    disable_sliding_window: bool = False
    hf_config: Any = field(default=None, repr=False)
    # how a pre-quantized fp8 checkpoint loads (fp8_checkpoint.Fp8Checkpoint), set by
    # __post_init__ for safetensors weights; None for an unquantized one or dummy weights
    checkpoint_fp8: Any = field(default=None, init=False, repr=False)
    # how a GPTQ or AWQ checkpoint loads (int_checkpoint.IntCheckpoint: dequantized to the
    # model's dtype), set by __post_init__ for safetensors weights; else None
    checkpoint_int: Any = field(default=None, init=False, repr=False)

    @property
    def checkpoint_quantization(self) -> str | None:
        """The quant_method of a pre-quantized fp8 checkpoint loaded as fp8 layers."""
        fmt = self.checkpoint_fp8
        if fmt is None or fmt.dequantized is not None or fmt.kv_cache_only:
            return None
        return fmt.method

    @property
    def checkpoint_dequantized(self) -> str | None:
        """ "<quant_method>, <why>" of an fp8 checkpoint loaded dequantized to the model's
        dtype (vllm/model_executor/layers/fp8_dequant.py)."""
        fmt = self.checkpoint_fp8
        if fmt is None or fmt.dequantized is None:
            return None
        return f"{fmt.method}, {fmt.dequantized}"

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.model
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < -1:
            raise ValueError(
                f"max_logprobs must be -1 (no limit) or an integer >= 0, got {self.max_logprobs!r}."
            )
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {list(LOGPROBS_MODES)}, got {self.logprobs_mode!r}."
            )
        if not isinstance(self.dtype, str) or self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {self.dtype!r}.")
        self.dtype = _resolve_dtype(self.dtype, self.device)
        if self.load_format not in _LOAD_FORMATS:
            raise ValueError(
                f"load_format must be one of {list(_LOAD_FORMATS)}, got {self.load_format!r}."
            )
        if not os.path.exists(self.model):
            raise ValueError(
                f"model {self.model!r} does not exist: pass a Hugging Face directory, a "
                ".gguf file or a Hugging Face Hub repository id (org/name)."
            )
        if self.hf_config_path is not None and not os.path.exists(self.hf_config_path):
            raise ValueError(
                f"hf_config_path {self.hf_config_path!r} does not exist: pass a Hugging Face "
                "directory holding config.json (or a .gguf file)."
            )
        if self.load_format == "auto":
            self.load_format = "gguf" if self.is_gguf else "safetensors"
        self.model_loader_extra_config = parse_json_object(
            "model_loader_extra_config", self.model_loader_extra_config
        )
        self.override_generation_config = parse_json_object(
            "override_generation_config", self.override_generation_config
        )
        self.hf_overrides = parse_json_object("hf_overrides", self.hf_overrides)
        if self.load_format == "gguf" and not self.is_gguf:
            raise ValueError(f"load_format='gguf' needs a .gguf file, got {self.model!r}.")
        from vllm.transformers_utils.generation_config import check_overrides, resolve_source

        resolve_source(self.model, self.generation_config)  # ValueError for a bad directory
        check_overrides(self.override_generation_config)
        if self.hf_config is None:
            self.hf_config = load_hf_config(
                self.hf_config_path or self.model, self.trust_remote_code
            )
            if self.hf_overrides:
                apply_hf_overrides(self.hf_config, self.hf_overrides)
        self._verify_architecture()
        self._verify_max_model_len()
        self._verify_quantization()

    @property
    def is_gguf(self) -> bool:
        from vllm.model_executor.model_loader.gguf_checks import is_gguf_file

        return is_gguf_file(self.model)

    @property
    def torch_dtype(self):
        """The torch.dtype of weights and activations (same as ``dtype`` once resolved)."""
        return self.dtype

    def _verify_architecture(self) -> None:
        from vllm.model_executor.layers.rotary_embedding import check_rope_types
        from vllm.model_executor.models import GGUF_ARCHS, ModelRegistry

        archs = getattr(self.hf_config, "architectures", None) or []
        known = [a for a in archs if a in ModelRegistry.get_supported_archs()]
        if self.is_gguf and (not known or known[0] not in GGUF_ARCHS):  # name the GGUF ones
            name = (known or archs or [f"<{getattr(self.hf_config, 'model_type', None)}>"])[0]
            raise ValueError(
                f"{name} is not supported from a GGUF file ({self.model!r}); GGUF files load "
                f"for {list(GGUF_ARCHS)}. Use the model's Hugging Face directory instead."
            )
        model_cls, _ = ModelRegistry.resolve_model_cls(archs)  # ValueError: the supported
        # what the model would refuse when it is built, refused now (before any process)
        check = getattr(model_cls, "check_config", None)
        if check is not None:
            check(self.hf_config)
        check_rope_types(self.hf_config)

    def _verify_quantization(self) -> None:
        from vllm.model_executor.layers.fp8_checkpoint import (
            CHECKPOINT_METHODS,
            checkpoint_fp8_method,
        )
        from vllm.model_executor.layers.int_checkpoint import INT_METHODS, checkpoint_int_method

        named = (*CHECKPOINT_METHODS, *INT_METHODS)  # a pre-quantized checkpoint's format
        allowed = (None, "fp8", *named)
        if self.quantization not in allowed:
            raise ValueError(
                f"quantization must be one of {list(allowed)}, got {self.quantization!r}."
            )
        fmt = None
        if self.load_format in ("safetensors", "dummy"):
            from vllm.model_executor.models import ModelRegistry
            from vllm.model_executor.models.moe_common import MoeWeightsMixin

            archs = getattr(self.hf_config, "architectures", None) or []
            moe = issubclass(ModelRegistry.resolve_model_cls(archs)[0], MoeWeightsMixin)
            try:
                fmt = checkpoint_int_method(self.model, self.hf_config)
                fmt = fmt or checkpoint_fp8_method(self.model, self.hf_config, moe)
            except ValueError:
                if self.load_format == "safetensors":
                    raise  # dummy weights: no checkpoint tensors to refuse, the model's dtype
        if fmt is None and self.quantization in named:
            raise ValueError(
                f"quantization={self.quantization!r} names a pre-quantized format, but "
                f"{self.model!r} has no quantization_config; use 'fp8' to quantize it on load."
            )
        if fmt is None:
            return
        if self.quantization not in (None, "fp8", fmt.method):
            raise ValueError(
                f"quantization={self.quantization!r} does not match the checkpoint's "
                f"quant_method={fmt.method!r}."
            )
        if fmt.method in INT_METHODS:
            # GPTQ / AWQ: no integer kernels, dequantized on load (vllm/model_executor/
            # layers/int_dequant.py), then quantized per row only when "fp8" is asked for
            if self.load_format == "safetensors":  # dummy: random weights, the model's dtype
                self.checkpoint_int = fmt
            if self.quantization != "fp8":
                self.quantization = None
            return
        if self.load_format == "safetensors":  # dummy: no checkpoint tensors to read
            self.checkpoint_fp8 = fmt
        if fmt.kv_cache_only:
            # weights as stored, KV-cache scales read: naming the format changes nothing,
            # "fp8" quantizes the weights on load as for an unquantized checkpoint
            if self.quantization == fmt.method:
                self.quantization = None
            return
        if fmt.dequantized is not None:
            # no fp8 kernels for it: dequantized on load (vllm/model_executor/layers/
            # fp8_dequant.py), then quantized per row only when "fp8" is asked for
            if self.quantization != "fp8":
                self.quantization = None
            return
        # the same layers and kernels as online fp8 (dummy weights: quantized on load)
        self.quantization = "fp8"

    def _verify_max_model_len(self) -> None:
        from vllm.model_executor.layers.yarn_rope import yarn_context_length
        from vllm.model_executor.models import context_limit, full_attention_limit

        positions = getattr(self.hf_config, "max_position_embeddings", None)
        limit = context_limit(self.hf_config)
        # how the message names the limit: the config's field, and the RoPE scaling if any
        limit_name = f"max_position_embeddings={positions}"
        if yarn_context_length(self.hf_config) is not None:
            limit_name = (
                f"context limit {limit} (yarn rope scaling: original_max_position_embeddings "
                "x factor)"
            )
        elif limit is not None and limit != positions:
            limit_name = (
                f"context limit {limit} (max_position_embeddings={positions} x RoPE factor "
                f"{limit / positions:g})"
            )
        window = full_attention_limit(self.hf_config, self.disable_sliding_window)
        if self.max_model_len is None:
            if limit is None:
                raise ValueError("max_model_len is not set and the config has no limit.")
            self.max_model_len = int(limit) if window is None else min(int(limit), window)
        if window is not None and self.max_model_len > window:
            why = (
                "disable_sliding_window caps the context at the smallest window"
                if self.disable_sliding_window and full_attention_limit(self.hf_config) is None
                else "every layer of this model uses sliding-window attention, which runs "
                "here only while the sequence fits in the window"
            )
            raise ValueError(
                f"max_model_len={self.max_model_len} is greater than the model's "
                f"sliding_window={window}: {why}."
            )
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}.")
        if limit is not None and self.max_model_len > limit:
            from vllm import envs

            if not envs.VLLM_ALLOW_LONG_MAX_MODEL_LEN:
                raise ValueError(
                    f"max_model_len={self.max_model_len} is greater than the model's "
                    f"{limit_name}; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows it, for models whose "
                    "positions extend past the config's limit."
                )
            # The config keeps its max_position_embeddings (RoPE scalings such as Phi-3's
            # LongRoPE derive factors from it); the model sizes its rotary tables from
            # max_model_len (vllm/model_executor/model_loader/loader.py).
            logger.warning(
                "max_model_len=%d is greater than the model's %s "
                "(allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN): outputs past it may be wrong.",
                self.max_model_len,
                limit_name,
            )

    # Shapes used by the cache and attention backends.
    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def num_attention_heads(self) -> int:
        return self.hf_config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return getattr(self.hf_config, "num_key_value_heads", None) or self.num_attention_heads

    def get_num_attention_heads(self, tp_size: int = 1) -> int:
        """Query heads on one of ``tp_size`` tensor-parallel ranks."""
        return self.num_attention_heads // tp_size

    def get_num_kv_heads(self, tp_size: int = 1) -> int:
        """KV heads on one of ``tp_size`` tensor-parallel ranks (at least 1: with more ranks
        than KV heads each rank holds one replicated head)."""
        return max(1, self.num_kv_heads // tp_size)

    @property
    def head_size(self) -> int:
        """Channels per attention head, as the KV cache and backends see them
        (:func:`~vllm.model_executor.models.attention_head_size`)."""
        from vllm.model_executor.models import attention_head_size

        return attention_head_size(self.hf_config)

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size


def parse_json_object(name: str, value: Any) -> dict | None:
    """A dict-valued option given as a dict or as JSON text (None stays None).

    Raises:
        ValueError: text that is not a JSON object, or another type (names ``name``).
    """
    import json

    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {value!r} ({e}).") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"{name} must be a JSON object, got {value!r}.")


def _resolve_dtype(name: str, device: str):
    """torch.dtype for a dtype name; "auto" is bfloat16 on CUDA and float32 on CPU."""
    import torch

    if name == "auto":
        name = "bfloat16" if device == "cuda" else "float32"
    return {
        "float32": torch.float32,
        "float": torch.float32,
        "float16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
    }[name]


@dataclass
class CacheConfig:
    """The paged KV cache.

    Args:
        block_size: tokens per block (1..256, a power of two for FlashInfer's sake).
        gpu_memory_utilization: fraction (0, 1] of GPU memory the engine may use in all.
        num_gpu_blocks_override: fixed usable block count per stage, split over its virtual
            engines; their scratch blocks come on top (testing).
        kv_cache_memory_bytes: KV cache bytes per worker (a stage's tensor-parallel rank),
            on CUDA and CPU; when set, neither ``gpu_memory_utilization`` nor
            ``cpu_kvcache_space_bytes`` sizes the cache (upstream's
            ``--kv-cache-memory-bytes``); ``num_gpu_blocks_override`` still wins.
        cpu_kvcache_space_bytes: KV cache bytes on CPU (env VLLM_CPU_KVCACHE_SPACE, in GiB;
            default 4 GiB as upstream).
        enable_prefix_caching: reuse the KV blocks of prompt prefixes seen before
            (vllm/core/block_manager.py). On by default: at a 0% hit rate it costs no
            measurable throughput (benchmarks/benchmark_prefix_caching.py, README).
        prefix_caching_hash_algo: how a cached block is identified: "sha256" (upstream's
            default; vllm/core/block_pool.py says why a cryptographic hash), the only one
            here; upstream's "sha256_cbor", "xxhash" and "xxhash_cbor" are refused.
        prefix_routing_margin: with several virtual engines and prefix caching, a new request
            goes to the engine holding its longest cached prefix unless that engine has more
            than this many unfinished requests above the least loaded one (>= 0; see
            ``LLMEngine.choose_virtual_engine``).
        cache_dtype: the cache's storage dtype by name (``--kv-cache-dtype``): ``auto``
            (the model's dtype), ``fp8`` / ``fp8_e4m3`` or ``fp8_e5m2``
            (vllm/attention/kv_cache_dtype.py).
    """

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    cpu_kvcache_space_bytes: int | None = None
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    prefix_routing_margin: int = 4
    cache_dtype: str = "auto"
    # Filled after profiling: blocks per virtual engine.
    num_gpu_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(
                f"block_size must be a power of two in [1, 256], got {self.block_size}."
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )
        if self.prefix_caching_hash_algo != "sha256":
            raise ValueError(
                f"prefix_caching_hash_algo must be 'sha256', got "
                f"{self.prefix_caching_hash_algo!r} (upstream's CBOR and xxhash variants are "
                "not implemented here)."
            )
        if self.prefix_routing_margin < 0:
            raise ValueError(
                f"prefix_routing_margin must be at least 0, got {self.prefix_routing_margin}."
            )
        from vllm.attention.kv_cache_dtype import check_kv_cache_dtype

        check_kv_cache_dtype(self.cache_dtype)
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(
                f"num_gpu_blocks_override must be at least 1, got {self.num_gpu_blocks_override}."
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(
                f"kv_cache_memory_bytes must be at least 1, got {self.kv_cache_memory_bytes}."
            )
        if self.cpu_kvcache_space_bytes is None:
            from vllm import envs

            value = envs.VLLM_CPU_KVCACHE_SPACE  # GiB; a ValueError names a bad value
            self.cpu_kvcache_space_bytes = int(value * (1 << 30))


@dataclass
class ParallelConfig:
    """Parallelism: tensor-parallel ranks per stage, pipeline stages (virtual engines =
    stages) and the executor backend. ``world_size = tp * pp`` processes, global rank
    ``pp_rank * tp + tp_rank`` (vllm/distributed/parallel_state.py)."""

    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    # Intra-op threads of each CPU worker (OMP_NUM_THREADS where the engine starts); None:
    # the worker host's cores divided by world_size. Fixed here, since Ray sets
    # OMP_NUM_THREADS in its actors to their CPU reservation.
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {self.cpu_threads}.")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}."
            )
        if self.pipeline_parallel_size < 1:
            raise ValueError(
                f"pipeline_parallel_size must be at least 1, got {self.pipeline_parallel_size}."
            )
        backends = (None, "uni", "mp", "ray")
        if self.distributed_executor_backend not in backends:
            raise ValueError(
                f"distributed_executor_backend must be one of {list(backends[1:])}, got "
                f"{self.distributed_executor_backend!r}."
            )
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "mp" if self.world_size > 1 else "uni"
        if self.world_size > 1 and self.distributed_executor_backend == "uni":
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} x pipeline_parallel_size="
                f"{self.pipeline_parallel_size} needs the 'mp' or 'ray' executor, not 'uni'."
            )

    @property
    def sampling_rank(self) -> int:
        """The global rank that samples and replies: TP rank 0 of the last stage."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel_size * self.tensor_parallel_size

    @property
    def streams_calls(self) -> bool:
        """Whether the mp executor's stages serve model calls as a stream
        (vllm/worker/pp_stream.py): under PP without TP."""
        return self.pipeline_parallel_size > 1 and self.tensor_parallel_size == 1


SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """Batching limits of each virtual engine's scheduler.

    Args:
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most tokens in one step (the per-step token budget).
            Without chunked prefill: default max(max_model_len, 2048), and below
            max_model_len is an error (a full-length prompt could never be scheduled).
            With chunked prefill: default 2048 (upstream vLLM V0's chunked default); a
            prompt longer than the budget is prefilled in chunks over several steps.
        num_lookahead_slots: KV slots reserved past each sequence: k of speculative
            decoding, or num_scheduler_steps - 1 of multi-step decoding.
        enable_chunked_prefill: each step schedules the running decodes first, then fills
            the rest of the token budget with prefill chunks (vllm/core/chunked_prefill.py).
        max_num_partial_prefills: with chunked prefill, the most requests whose prefill is
            partly done at once (default 1); each prefill chunk then takes at most
            max_num_batched_tokens // max_num_partial_prefills tokens per sequence. Above 1
            without chunked prefill is an error, as upstream.
        num_scheduler_steps: decode forward passes per scheduler call (upstream V0's
            multi-step scheduling, vllm/worker/multi_step.py); 1 = one token per step.
            With chunked prefill a step that holds a prefill chunk runs one pass and a
            decode-only step up to this many.
        policy: "fcfs" (arrival order) or "priority" (each request's priority, lower
            first, then arrival; see vllm/core/scheduler.py).

    Raises:
        ValueError: naming the value and its limit (see the checks below).
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    num_lookahead_slots: int = 0
    enable_chunked_prefill: bool = False
    max_num_partial_prefills: int = 1
    num_scheduler_steps: int = 1
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, got "
                f"{self.policy!r}."
            )
        if self.num_scheduler_steps < 1:
            raise ValueError(
                f"num_scheduler_steps must be at least 1, got {self.num_scheduler_steps}."
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.max_num_partial_prefills < 1:
            raise ValueError(
                f"max_num_partial_prefills must be at least 1, got {self.max_num_partial_prefills}."
            )
        if self.max_num_partial_prefills > 1 and not self.enable_chunked_prefill:
            raise ValueError(
                f"max_num_partial_prefills={self.max_num_partial_prefills} needs "
                "enable_chunked_prefill=True (--enable-chunked-prefill): without chunked "
                "prefill no prefill is ever partly done."
            )
        if self.max_num_batched_tokens is None:
            if self.enable_chunked_prefill:
                self.max_num_batched_tokens = 2048
            else:
                self.max_num_batched_tokens = max(self.max_model_len, 2048)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than "
                f"max_model_len={self.max_model_len}: a full-length prompt could never be "
                "scheduled (enable chunked prefill to split long prompts)."
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be at least "
                f"max_num_seqs={self.max_num_seqs}."
            )
        if self.max_num_partial_prefills > self.max_num_batched_tokens:
            raise ValueError(
                f"max_num_partial_prefills={self.max_num_partial_prefills} must be at most "
                f"max_num_batched_tokens={self.max_num_batched_tokens}."
            )

    @property
    def prefill_chunk_cap(self) -> int:
        """Most tokens one sequence's prefill chunk may take in a step (chunked prefill)."""
        return self.max_num_batched_tokens // self.max_num_partial_prefills


@dataclass
class CompilationConfig:
    """CUDA-graph settings (see docs/design.md "The capture-size rule").

    Args:
        enforce_eager: never capture graphs.
        max_cudagraph_capture_size: ceiling on captured batch sizes (default 512).
        cuda_graph_sizes: explicit list of sizes replacing the rule's list.
        max_seq_len_to_capture: longest context a captured graph serves (default 8192,
            capped at max_model_len); longer decode batches run eagerly.
        prefill_graph_max_tokens: longest one-prompt prefill (tokens) served by a prefill
            graph (default 512: eleven graphs, 16 ... 512; 0 captures none).
        disable_decode_loop_graphs: with multi-step decoding, do not capture the graphs that
            replay one decode step N times (default False: captured up to the attention
            backend's ``loop_max_rows()``).
        small_decode_max_rows: the most decode rows the FLASHINFER backend's Triton
            small-decode path takes (default 1; 0 = off; at most 64).
        piecewise_graph_max_tokens: most tokens of a prefill or mixed step replayed from
            piecewise graphs (vllm/cudagraph/piecewise.py: every layer's projections and
            MLP captured, attention eager), capped at max_num_batched_tokens; default 0
            (off: such steps run eagerly); EngineArgs resolves an unset flag to 512 for
            chunked prefill on one CUDA device.
    """

    enforce_eager: bool = False
    max_cudagraph_capture_size: int = 512
    cuda_graph_sizes: list[int] | None = None
    max_seq_len_to_capture: int = 8192
    prefill_graph_max_tokens: int = 512
    disable_decode_loop_graphs: bool = False
    small_decode_max_rows: int = 1
    piecewise_graph_max_tokens: int = 0

    def __post_init__(self) -> None:
        if self.piecewise_graph_max_tokens < 0:
            raise ValueError(
                f"piecewise_graph_max_tokens must be >= 0 (0 = no piecewise graphs), got "
                f"{self.piecewise_graph_max_tokens}."
            )
        if self.prefill_graph_max_tokens < 0:
            raise ValueError(
                f"prefill_graph_max_tokens must be >= 0 (0 = no prefill graphs), got "
                f"{self.prefill_graph_max_tokens}."
            )
        if not 0 <= self.small_decode_max_rows <= 64:
            raise ValueError(
                f"small_decode_max_rows must be in [0, 64] (0 = off), got "
                f"{self.small_decode_max_rows}."
            )
        if self.max_cudagraph_capture_size < 1:
            raise ValueError(
                "max_cudagraph_capture_size must be at least 1, got "
                f"{self.max_cudagraph_capture_size}."
            )
        if self.cuda_graph_sizes is not None:
            bad = [s for s in self.cuda_graph_sizes if int(s) < 1]
            if bad or not self.cuda_graph_sizes:
                raise ValueError(
                    f"cuda_graph_sizes must be a non-empty list of sizes >= 1, got "
                    f"{self.cuda_graph_sizes}."
                )
            self.cuda_graph_sizes = sorted({int(s) for s in self.cuda_graph_sizes})


@dataclass
class DecodingConfig:
    """Structured outputs (upstream's ``DecodingConfig``).

    Attributes:
        guided_decoding_backend: the library that turns JSON schemas, regexes, choices and
            grammars into token masks; only "xgrammar" is built in ("auto", upstream's
            default, is stored as "xgrammar").
        disable_any_whitespace: every JSON constraint (json, json_object, tool
            arguments) allows no free whitespace, as if each request set its
            ``disable_any_whitespace`` (upstream's ``StructuredOutputsConfig`` key).
        enable_in_reasoning: with a server's ``--reasoning-parser``, constrain a reply
            from its first token, reasoning included (upstream's key of that name).
            False (the default): the server's constrained requests carry the parser's
            tag ids and their grammar starts after the reasoning ends (see
            ``GuidedDecodingParams.reasoning_token_ids``).

    Raises:
        ValueError: an unknown backend (the message lists the known ones).
    """

    guided_decoding_backend: str = "xgrammar"
    disable_any_whitespace: bool = False
    enable_in_reasoning: bool = False

    def __post_init__(self) -> None:
        from vllm.sampling_params import (
            AUTO_GUIDED_BACKEND,
            GUIDED_DECODING_BACKENDS,
            resolve_guided_backend,
        )

        backend = self.guided_decoding_backend
        if not isinstance(backend, str) or resolve_guided_backend(backend) not in (
            GUIDED_DECODING_BACKENDS
        ):
            raise ValueError(
                "guided_decoding_backend must be one of "
                f"{[AUTO_GUIDED_BACKEND, *GUIDED_DECODING_BACKENDS]}, got {backend!r}."
            )
        self.guided_decoding_backend = resolve_guided_backend(backend)


@dataclass
class EngineConfig:
    """All configs of one engine, cross-checked in :meth:`verify`."""

    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    speculative_config: Any = None
    decoding_config: DecodingConfig = field(default_factory=DecodingConfig)
    lora_config: Any = None  # vllm.lora.config.LoRAConfig with enable_lora
    pooler_config: Any = None  # vllm.pooling.config.PoolerConfig with task embed
    # Test-only: several virtual engines without PP (docs/design.md guarantee 1 on one device).
    num_virtual_engines_override: int | None = None

    def __post_init__(self) -> None:
        self.verify()

    @property
    def num_virtual_engines(self) -> int:
        """Pipeline stages, or ``num_virtual_engines_override`` when set (not an EngineArgs
        field or CLI flag: tests set it on the built config, see tests/utils.py
        ``virtual_engines_override``)."""
        if self.num_virtual_engines_override:
            return self.num_virtual_engines_override
        return self.parallel_config.pipeline_parallel_size

    def verify(self) -> None:
        """Cross-check the configs.

        Raises:
            ValueError: naming the bad combination.
        """
        pp = self.parallel_config.pipeline_parallel_size
        layers = self.model_config.num_layers
        if pp > layers:
            raise ValueError(
                f"pipeline_parallel_size={pp} is larger than the model's {layers} layers."
            )
        from vllm.distributed.utils import get_pp_partition
        from vllm.distributed.validation import (
            verify_tensor_parallel,
            verify_world_fits_devices,
        )

        get_pp_partition(layers, pp)  # a bad VLLM_PP_LAYER_PARTITION, before any worker

        par = self.parallel_config
        verify_tensor_parallel(self.model_config.hf_config, par.tensor_parallel_size)
        if self.device_config.device == "cuda":
            import torch

            verify_world_fits_devices(
                par.tensor_parallel_size, pp, "cuda", par.distributed_executor_backend,
                torch.cuda.device_count(),
            )  # fmt: skip
        from vllm.attention.selector import which_attn_backend

        # An explicit backend that cannot run fails here, before any load.
        mc = self.model_config
        dc = self.device_config
        which_attn_backend(dc.device, mc.dtype, mc.head_size, dc.attention_backend)
        cc = self.compilation_config
        cc.max_seq_len_to_capture = min(cc.max_seq_len_to_capture, self.model_config.max_model_len)
        if self.device_config.device == "cpu":
            cc.enforce_eager = True


NGRAM_MODEL = "[ngram]"


@dataclass
class SpeculativeConfig:
    """Speculative decoding (upstream V0 names): a draft model or n-gram prompt lookup
    proposes ``num_speculative_tokens`` (k) tokens per step, the target scores them by batch
    expansion and a rejection sampler keeps a prefix (docs/design.md "Speculative decoding").

    Args:
        speculative_model: a draft checkpoint path (HF directory or .gguf) or "[ngram]".
        num_speculative_tokens: k >= 1.
        ngram_prompt_lookup_max / _min: longest / shortest suffix n-gram looked up ("[ngram]").
        speculative_max_model_len: the draft's context limit in tokens (default: the smaller
            of the draft's max_position_embeddings and the target's max_model_len).
        speculative_disable_by_batch_size: speculation is skipped for steps with at least this
            many running requests (None: never skipped).
        draft_model_config: the draft's ModelConfig (built here; None for "[ngram]").

    Raises:
        ValueError: in :meth:`create` (see there).
    """

    speculative_model: str
    num_speculative_tokens: int
    ngram_prompt_lookup_max: int | None = None
    ngram_prompt_lookup_min: int = 1
    speculative_max_model_len: int | None = None
    speculative_disable_by_batch_size: int | None = None
    draft_model_config: Any = field(default=None, repr=False)

    @property
    def is_ngram(self) -> bool:
        return self.speculative_model == NGRAM_MODEL

    @staticmethod
    def create(
        target: ModelConfig,
        parallel: ParallelConfig,
        speculative_model: str | None,
        num_speculative_tokens: int | None,
        ngram_prompt_lookup_max: int | None = None,
        ngram_prompt_lookup_min: int | None = None,
        speculative_max_model_len: int | None = None,
        speculative_disable_by_batch_size: int | None = None,
        speculative_draft_tensor_parallel_size: int | None = None,
    ) -> SpeculativeConfig | None:
        """Validate the speculative flags (reading only configs, never weights).

        Returns None when neither ``speculative_model`` nor ``num_speculative_tokens`` is set.

        Raises:
            ValueError: k without a model, a model without k, k < 1, bad n-gram bounds,
                pipeline_parallel_size > 1, a draft tensor-parallel size other than the
                target's, a draft whose vocab size differs from the target's (naming both)
                or whose heads or widths do not split over the tensor-parallel ranks
                (``verify_tensor_parallel``), speculative_max_model_len < 1.
        """
        if speculative_model is None and num_speculative_tokens is None:
            return None
        if speculative_model is None:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens} was given without "
                "speculative_model (a draft model path or '[ngram]')."
            )
        if num_speculative_tokens is None:
            raise ValueError(
                f"speculative_model={speculative_model!r} needs num_speculative_tokens (k >= 1)."
            )
        if num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be at least 1, got {num_speculative_tokens}."
            )
        if parallel.pipeline_parallel_size > 1:
            raise ValueError(
                "speculative decoding is not supported with pipeline parallelism: "
                f"pipeline_parallel_size={parallel.pipeline_parallel_size} (only 1 is allowed "
                "with speculative_model)."
            )
        tp = parallel.tensor_parallel_size
        if speculative_draft_tensor_parallel_size not in (None, tp):
            raise ValueError(
                "speculative_draft_tensor_parallel_size="
                f"{speculative_draft_tensor_parallel_size} differs from "
                f"tensor_parallel_size={tp}: the draft model runs sharded over the target's "
                f"ranks (leave it unset or give {tp})."
            )
        if speculative_disable_by_batch_size is not None and speculative_disable_by_batch_size < 2:
            raise ValueError(
                "speculative_disable_by_batch_size must be at least 2, got "
                f"{speculative_disable_by_batch_size}."
            )
        lo = 1 if ngram_prompt_lookup_min is None else ngram_prompt_lookup_min
        cfg = SpeculativeConfig(
            speculative_model,
            num_speculative_tokens,
            ngram_prompt_lookup_max,
            lo,
            speculative_max_model_len,
            speculative_disable_by_batch_size,
        )
        if cfg.is_ngram:
            hi = ngram_prompt_lookup_max
            if hi is None or hi < 1:
                raise ValueError(
                    f"speculative_model='[ngram]' needs ngram_prompt_lookup_max >= 1, got {hi}."
                )
            if not 1 <= lo <= hi:
                raise ValueError(
                    f"ngram_prompt_lookup_min must be in [1, ngram_prompt_lookup_max={hi}], "
                    f"got {lo}."
                )
            limit = target.max_model_len
        else:
            draft = ModelConfig(
                model=speculative_model,
                dtype=_dtype_name(target.dtype),
                seed=target.seed,
                max_model_len=None,
                skip_tokenizer_init=True,
                trust_remote_code=target.trust_remote_code,
                device=target.device,
            )
            if draft.vocab_size != target.vocab_size:
                raise ValueError(
                    f"the draft model's vocab size {draft.vocab_size} ({speculative_model!r}) "
                    f"differs from the target's vocab size {target.vocab_size} "
                    f"({target.model!r}); they must be equal."
                )
            if tp > 1:
                from vllm.distributed.validation import verify_tensor_parallel

                try:
                    verify_tensor_parallel(draft.hf_config, tp)
                except ValueError as e:
                    raise ValueError(f"the draft model {speculative_model!r}: {e}") from None
            limit = min(draft.max_model_len, target.max_model_len)
            cfg.draft_model_config = draft
        if speculative_max_model_len is not None:
            if not 1 <= speculative_max_model_len <= limit:
                raise ValueError(
                    f"speculative_max_model_len must be in [1, {limit}], got "
                    f"{speculative_max_model_len}."
                )
            limit = speculative_max_model_len
        cfg.speculative_max_model_len = limit
        if cfg.draft_model_config is not None:
            cfg.draft_model_config.max_model_len = limit
        return cfg


def _dtype_name(dtype) -> str:
    """The dtype name ModelConfig accepts for a resolved torch.dtype."""
    import torch

    return {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
