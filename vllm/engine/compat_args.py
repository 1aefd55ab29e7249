"""Upstream flags that this engine accepts with the values it supports.

Scripts written for upstream vLLM pass flags such as ``--trust-remote-code``,
``--kv-cache-dtype auto`` or ``--swap-space 4``. Each is accepted here when its value
means what this engine does anyway, and refused with a ValueError naming the value and
what is supported otherwise, before any weight is read:

- ``tokenizer_mode``: ``auto`` (a fast tokenizer when there is one), ``hf`` (upstream's
  name for the Hugging Face tokenizer: the same as ``auto`` here, which never picks
  another kind) or ``slow`` (``use_fast=False``); ``mistral`` (mistral_common),
  ``deepseek_v32`` and custom modes are refused.
- ``trust_remote_code``: passed to transformers when the config and the tokenizer are
  loaded (a config with ``auto_map`` needs it). The model classes are this engine's own
  (``ModelRegistry``), so a checkpoint's custom modelling code is never run.
- ``revision``, ``download_dir``: for a model named by Hugging Face Hub repository
  (vllm/transformers_utils/hub.py); logged as ignored with a local path.
- ``quantization``: None, ``gguf`` for a .gguf file (what the file's own tensor types
  say is used in either case), ``fp8`` for a Hugging Face checkpoint, quantized on load
  (vllm/model_executor/layers/fp8.py), ``compressed-tensors`` / ``fbgemm_fp8`` naming
  an fp8 checkpoint's own format (vllm/model_executor/layers/fp8_checkpoint.py), or
  ``gptq`` / ``awq`` naming a GPTQ / AWQ checkpoint's (dequantized on load,
  vllm/model_executor/layers/int_checkpoint.py); other methods, and ``fp8`` with a .gguf
  file, are refused.
- ``swap_space``: GiB of CPU swap per GPU in upstream V0, >= 0. Preempted sequences are
  recomputed here (as in upstream V1), so no swap space is allocated.
- ``tokenizer_revision``, ``disable_custom_all_reduce``, ``compilation_config``,
  ``max_parallel_loading_workers``: logged as ignored when set (local tokenizers;
  torch.distributed's all-reduce; no torch.compile; every rank loads its own weights).
- ``cpu_offload_gb`` (only 0), ``preemption_mode`` (None or ``recompute``),
  ``calculate_kv_scales`` (only False: an 8-bit KV cache uses the checkpoint's
  ``k_scale`` / ``v_scale``, or 1.0 where it has none).
  (``disable_sliding_window`` is a ``ModelConfig`` field: it caps max_model_len at the
  model's smallest sliding window, as upstream.)
- With ``enable_lora``: ``lora_dtype`` (``auto``, the model's dtype, or that dtype's
  name), ``fully_sharded_loras`` (logged as ignored: each TP rank holds its cut of an
  adapter already).
- ``task`` / ``runner`` / ``convert``: see vllm/pooling/config.py (generation, or
  embeddings with ``embed`` / ``pooling``; scoring and classification are refused).
- ``lora_extra_vocab_size`` (upstream's default 256; deprecated there): logged as ignored
  when set to another value (adapters add no vocabulary rows here).
  ``long_lora_scaling_factors``: refused when given (no long-context LoRA).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

TOKENIZER_MODES = ("auto", "hf", "slow")


def check_compat_args(
    model: str,
    tokenizer_mode: str,
    quantization: str | None,
    swap_space: float,
) -> None:
    """Validate the compatibility flags (see the module docstring).

    Raises:
        ValueError: naming the flag, its value and the supported values.
    """
    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(
            f"tokenizer_mode={tokenizer_mode!r} (--tokenizer-mode {tokenizer_mode}) is not "
            f"supported: tokenizers are Hugging Face (transformers) ones; use one of "
            f"{list(TOKENIZER_MODES)}."
        )
    from vllm.model_executor.model_loader.gguf_checks import is_gguf_file

    # by name too: a missing path is reported by the model config, not as a bad quantization
    is_gguf = model.endswith(".gguf") or is_gguf_file(model)
    if quantization == "fp8" and is_gguf:
        raise ValueError(
            f"quantization='fp8' quantizes a Hugging Face checkpoint's weights on load; "
            f"{model!r} is a GGUF file, whose tensor types are used as stored. Pass the "
            "model's Hugging Face directory with quantization='fp8', or the GGUF file "
            "without it."
        )
    from vllm.model_executor.layers.fp8_checkpoint import CHECKPOINT_METHODS
    from vllm.model_executor.layers.int_checkpoint import INT_METHODS

    known = (None, "gguf", "fp8", *CHECKPOINT_METHODS, *INT_METHODS)
    if quantization not in known or (quantization == "gguf" and not is_gguf):
        raise ValueError(
            f"quantization={quantization!r} is not supported; use None (the checkpoint's "
            "own weights, an fp8 checkpoint's quantization_config followed), 'fp8' (a Hugging "
            "Face checkpoint quantized to fp8 on load), 'compressed-tensors' / 'fbgemm_fp8' "
            "(an fp8 checkpoint of that format), 'gptq' / 'awq' (a GPTQ / AWQ checkpoint, "
            "dequantized on load) or 'gguf' with a .gguf file (its tensor types are used "
            "as stored)."
        )
    if not swap_space >= 0:
        raise ValueError(f"swap_space must be >= 0 (GiB), got {swap_space}.")


def check_upstream_switches(
    model: str,
    tokenizer_revision: str | None,
    cpu_offload_gb: float,
    preemption_mode: str | None,
    disable_custom_all_reduce: bool,
    compilation_config: object,
    max_parallel_loading_workers: int | None = None,
    calculate_kv_scales: bool = False,
) -> None:
    """Validate the upstream switches of the module docstring's second list.

    Raises:
        ValueError: a value other than the one supported, naming the flag.
    """
    if cpu_offload_gb != 0:
        raise ValueError(f"cpu_offload_gb={cpu_offload_gb} is not supported; only 0.")
    if calculate_kv_scales:
        raise ValueError(
            "calculate_kv_scales=True is not supported: an 8-bit KV cache (--kv-cache-dtype "
            "fp8) uses the checkpoint's k_scale / v_scale, or scale 1 where it has none; "
            "scales are not computed from the data."
        )
    if preemption_mode not in (None, "recompute"):
        raise ValueError(
            f"preemption_mode={preemption_mode!r} is not supported; preempted requests are "
            "recomputed ('recompute', no swap space)."
        )
    for name, value, why in (
        ("tokenizer_revision", tokenizer_revision, f"the tokenizer is read from {model!r}"),
        ("disable_custom_all_reduce", disable_custom_all_reduce,
         "tensor parallelism always uses torch.distributed's all-reduce"),
        ("compilation_config", compilation_config, "the model is not compiled"),
        ("max_parallel_loading_workers", max_parallel_loading_workers,
         "each rank reads only its own layers and shard, in its own process"),
    ):  # fmt: skip
        if value:
            logger.warning("%s=%r is ignored: %s.", name, value, why)


def check_lora_switches(lora_dtype: str, model_dtype, fully_sharded_loras: bool) -> None:
    """Validate upstream's LoRA switches (an engine with ``enable_lora``).

    Args:
        lora_dtype: ``auto`` or a dtype name; the adapters' slots hold the model's dtype.
        model_dtype: the resolved torch.dtype of the model.
        fully_sharded_loras: upstream's tensor-parallel sharding of the LoRA GEMMs.
    Raises:
        ValueError: a lora_dtype other than ``auto`` and the model's dtype, naming both.
    """
    model_name = str(model_dtype).removeprefix("torch.")
    if lora_dtype not in ("auto", model_name):
        raise ValueError(
            f"lora_dtype={lora_dtype!r} is not supported; adapters are held in the model's "
            f"dtype ({model_name}): use 'auto' or {model_name!r}."
        )
    if fully_sharded_loras:
        logger.warning(
            "fully_sharded_loras=True is ignored: under tensor parallelism each rank holds "
            "its cut of an adapter as of the weights."
        )


LORA_EXTRA_VOCAB_SIZE = 256  # upstream's default of --lora-extra-vocab-size


def check_upstream_lora_flags(
    lora_extra_vocab_size: int, long_lora_scaling_factors: list[float] | None
) -> None:
    """Validate upstream's LoRA flags that this engine has no use for (with or without
    ``enable_lora``).

    Args:
        lora_extra_vocab_size: upstream's extra vocabulary rows per adapter (deprecated
            there); any value other than 256 is logged as ignored.
        long_lora_scaling_factors: upstream's long-context LoRA scaling factors; refused
            when given.
    Raises:
        ValueError: ``long_lora_scaling_factors`` given (the message names its flag), or a
            negative ``lora_extra_vocab_size``.
    """
    if long_lora_scaling_factors is not None:
        raise ValueError(
            f"long_lora_scaling_factors={list(long_lora_scaling_factors)} "
            "(--long-lora-scaling-factors) is not supported: long-context LoRA adapters "
            "are not implemented; serve adapters without it."
        )
    if lora_extra_vocab_size < 0:
        raise ValueError(f"lora_extra_vocab_size must be >= 0, got {lora_extra_vocab_size}.")
    if lora_extra_vocab_size != LORA_EXTRA_VOCAB_SIZE:
        logger.warning(
            "lora_extra_vocab_size=%d is ignored (upstream deprecated it): adapters add no "
            "vocabulary rows (embedding adapters are refused).", lora_extra_vocab_size,
        )  # fmt: skip
