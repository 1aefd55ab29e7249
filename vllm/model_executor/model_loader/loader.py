"""Build a model for one pipeline stage and fill its weights.

Load formats: ``safetensors`` (HF checkpoint directory), ``gguf`` (one ``.gguf`` file),
``dummy`` (deterministic values seeded per parameter name, for benchmarks), ``sim`` (the
pipeline simulator's stand-in that only waits, see sim_model.py) and ``auto`` (``gguf`` for
a path ending in ``.gguf``, else ``safetensors``).

Tensor parallelism: the model is built with this rank's shard shapes (the layers read the TP
group); safetensors tensors arrive as lazy slices that each parameter's ``weight_loader``
narrows to its rows or columns before reading, so no rank materialises the full model.
GGUF tensors are dequantised whole (one at a time), then sharded the same way.
"""

import contextlib
import logging
import time
from collections.abc import Iterator

import torch
from torch import nn

from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size
from vllm.model_executor.model_loader.gguf_checks import is_gguf_file
from vllm.model_executor.model_loader.gguf_loader import gguf_weights_iterator
from vllm.model_executor.models import architectures_of, get_model_class, is_headless
from vllm.model_executor.weight_utils import (
    fill_dummy_weights,
    safetensors_files,
    safetensors_weights_iterator,
)

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy", "sim")


def resolve_load_format(model: str, load_format: str) -> str:
    """``auto`` -> ``gguf`` for a GGUF file (``gguf_checks.is_gguf_file``: a ``.gguf``
    name or the GGUF magic bytes), else ``safetensors``; others unchanged.

    Raises:
        ValueError: a format outside ``LOAD_FORMATS``.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format={load_format!r} is not one of {list(LOAD_FORMATS)}")
    if load_format == "auto":
        return "gguf" if is_gguf_file(str(model)) else "safetensors"
    return load_format


def _holds_bare_stack(model_dir: str) -> bool:
    """Whether a safetensors checkpoint of a causal-LM architecture holds only the decoder
    stack, its tensors named without the ``model.`` prefix (``embed_tokens.weight``,
    ``layers.0...``) and without an LM head, as Qwen3-Embedding ships under
    ``Qwen3ForCausalLM``; transformers and upstream load such a checkpoint into the causal
    LM's ``model``."""
    from safetensors import SafetensorError, safe_open

    names = []
    for path in safetensors_files(model_dir):
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                names.extend(f.keys())
        except SafetensorError:  # the weights iterator names the unreadable file
            return False
    return bool(names) and not any(n.startswith(("model.", "lm_head.")) for n in names)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily set torch's default floating dtype (restored on exit)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def get_model(
    model_config, device, pp_rank: int = 0, pp_size: int = 1, pooling: bool = False
) -> nn.Module:
    """Build the model of ``model_config`` for stage ``pp_rank`` of ``pp_size`` and load it.

    Uses ``model_config.model`` (HF directory or ``.gguf`` file), ``.hf_config``, ``.dtype``,
    ``.load_format``, ``.seed`` and ``.max_model_len`` (the rotary tables' length when it
    exceeds the config's ``max_position_embeddings``). Parameters are created directly on
    ``device`` in ``dtype``. Returns the model in eval mode with parameters that need no
    gradient (as upstream's), so code reaching it (``LLM.apply_model``) may update weights
    in place. ``pooling`` (an embedding engine): a checkpoint that holds only the decoder
    stack under a causal-LM architecture (see :func:`_holds_bare_stack`) loads with its
    unused LM head tied to the embedding, as a headless one does.

    Raises:
        ValueError: unsupported architecture (listing the supported ones), bad load format,
            or parameters the checkpoint did not provide (naming them).
    """
    hf_config = model_config.hf_config
    tp_size = get_tensor_model_parallel_world_size()
    model_cls = get_model_class(architectures_of(hf_config))
    load_format = resolve_load_format(model_config.model, model_config.load_format)
    headless = is_headless(hf_config)  # an architecture without LM head (LlamaModel ...)
    bare = not headless and load_format == "safetensors" and _holds_bare_stack(model_config.model)
    if headless or (bare and pooling):
        # no LM head: the (unused) logits of an embedding engine use the embedding
        hf_config.tie_word_embeddings = True
    if load_format == "sim":
        from vllm.model_executor.model_loader.sim_model import SimStageModel, SimTiming

        timing = SimTiming.from_extra_config(model_config.model_loader_extra_config)
        model = SimStageModel(
            hf_config, pp_rank, pp_size, timing, model_config.dtype, model_config.model
        )
        return model.to(device).requires_grad_(False).eval()
    start = time.perf_counter()
    prequantized = getattr(model_config, "checkpoint_quantization", None)  # an fp8 format
    dequantized = getattr(model_config, "checkpoint_dequantized", None)  # an fp8 format's why
    with _default_dtype(model_config.dtype), torch.device(device):
        model = model_cls(
            hf_config, pp_rank=pp_rank, pp_size=pp_size, max_model_len=model_config.max_model_len
        )
    if load_format == "dummy":
        aliases = {}
        if getattr(hf_config, "tie_word_embeddings", False):
            aliases["lm_head.weight"] = "model.embed_tokens.weight"  # same values on every split
        fill_dummy_weights(model, model_config.seed, aliases)
    else:
        if load_format == "gguf":
            num_heads = hf_config.num_attention_heads
            num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
            layers = (getattr(model, "start_layer", 0), getattr(model, "end_layer", 1 << 30))
            weights = gguf_weights_iterator(model_config.model, num_heads, num_kv_heads, layers)
        else:  # under TP each rank reads only its shard of every tensor
            weights = safetensors_weights_iterator(model_config.model, lazy=tp_size > 1)
            if headless or bare:  # the stack's tensors are named as the causal LM's "model."
                weights = ((n if n.startswith("model.") else f"model.{n}", t) for n, t in weights)
            if prequantized:
                weights = _prepare_fp8_checkpoint(model, weights, model_config)
            elif dequantized:
                weights = _dequantized_fp8_checkpoint(weights, model_config)
            elif getattr(model_config, "checkpoint_int", None) is not None:
                weights = _dequantized_int_checkpoint(weights, model_config)
            elif getattr(model_config, "checkpoint_fp8", None) is not None:
                weights = _kv_cache_only_checkpoint(weights, model_config)
        with torch.no_grad():
            loaded = model.load_weights(weights)
        missing = sorted({name for name, _ in model.named_parameters()} - loaded)
        if missing:
            shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise ValueError(
                f"{len(missing)} parameters were not found in checkpoint "
                f"{model_config.model!r} ({load_format}): {shown}"
            )
        _log_kv_scales(model)
    if getattr(model_config, "quantization", None) == "fp8" and not prequantized:
        _quantize_fp8(model)
    logger.info(
        "Loading model weights (%s, %s, pp_rank %d/%d, layers [%d, %d)) took %.2f s",
        load_format,
        model_config.dtype,
        pp_rank,
        pp_size,
        getattr(model, "start_layer", 0),
        getattr(model, "end_layer", 0),
        time.perf_counter() - start,
    )
    return model.requires_grad_(False).eval()


def _log_kv_scales(model: nn.Module) -> None:
    """Log the KV-cache scales the checkpoint set (vllm/model_executor/layers/kv_scales.py),
    if any differ from 1.0: how many layers, and the range of k_scale and of v_scale."""
    from vllm.model_executor.layers.kv_scales import kv_scales_of

    scales = kv_scales_of(model)
    if all(pair == (1.0, 1.0) for pair in scales):
        return
    ks, vs = [k for k, _ in scales], [v for _, v in scales]
    logger.info(
        "Loaded the checkpoint's KV-cache scales of %d attention layers: k_scale %.4g..%.4g, "
        "v_scale %.4g..%.4g (applied by an 8-bit KV cache, unused by --kv-cache-dtype auto)",
        len(scales), min(ks), max(ks), min(vs), max(vs),
    )  # fmt: skip


def _quantize_fp8(model: nn.Module) -> None:
    """``--quantization fp8``: the model's projections to float8_e4m3fn
    (vllm/model_executor/layers/fp8.py), logging what it saved; the 16-bit copies are
    released to the device before the KV cache is sized."""
    from vllm.model_executor.layers.fp8 import quantize_model

    start = time.perf_counter()
    count, before, after = quantize_model(model)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    logger.info(
        "Quantized %d linear layers (q/k/v, o, gate/up, down projections) to fp8 "
        "(float8_e4m3fn, a scale per output row): %.1f MiB -> %.1f MiB in %.2f s; the "
        "embedding, norms, lm_head and any MoE router and experts keep the model's dtype",
        count,
        before / 2**20,
        after / 2**20,
        time.perf_counter() - start,
    )


def _prepare_fp8_checkpoint(model: nn.Module, weights, model_config):
    """A pre-quantized fp8 checkpoint (vllm/model_executor/layers/fp8_checkpoint.py): the
    model's projections, but those its quantization config keeps unquantized, become
    fp8 parameters with scales before loading; the weights iterator without the tensors
    nothing reads (``fp8_checkpoint.is_unused_tensor``: static activation scales, zero
    points; KV-cache scales stay), refusing a quantized lm_head."""
    from vllm.model_executor.layers.fp8_checkpoint import (
        fp8_layer_tensors,
        prepare_fp8_params,
        stored_quantization,
        unquantized_modules,
    )

    _, stored = stored_quantization(model_config.hf_config, model_config.model)
    kept = unquantized_modules(stored)
    logger.info("Loading %d fp8 linear layers from the checkpoint", prepare_fp8_params(model, kept))
    return fp8_layer_tensors(weights, model_config.model, model_config.hf_config)


def _kv_cache_only_checkpoint(weights, model_config):
    """A checkpoint whose quantization config quantizes only the KV cache
    (``Fp8Checkpoint.kv_cache_only``): the weights iterator without the tensors nothing
    reads (``fp8_checkpoint.is_unused_tensor``: the zero points older releases wrote beside
    the k / v projections' output scales); the weights load as stored, the KV-cache scales
    into the attention layers (vllm/model_executor/layers/kv_scales.py)."""
    from vllm.model_executor.layers.fp8_checkpoint import is_unused_tensor

    logger.info(
        "%r quantizes only the KV cache (quant_method %r): its weights load as stored",
        model_config.model,
        model_config.checkpoint_fp8.method,
    )
    return ((name, w) for name, w in weights if not is_unused_tensor(name))


def _dequantized_fp8_checkpoint(weights, model_config):
    """An fp8 checkpoint without fp8 kernels here (block-wise scales, mixture of experts):
    the weights iterator with each fp8 weight dequantized to the model's dtype
    (vllm/model_executor/layers/fp8_dequant.py), without the tensors nothing reads
    (``fp8_checkpoint.is_unused_tensor``; KV-cache scales stay)."""
    from vllm.model_executor.layers.fp8_checkpoint import is_unused_tensor
    from vllm.model_executor.layers.fp8_dequant import dequantized_weights

    fmt = model_config.checkpoint_fp8
    logger.info(
        "Dequantizing the checkpoint's fp8 weights (quant_method %r, %s) to %s on load",
        fmt.method,
        fmt.dequantized,
        model_config.dtype,
    )
    used = ((name, w) for name, w in weights if not is_unused_tensor(name))
    return dequantized_weights(used, fmt.block, model_config.dtype)


def _dequantized_int_checkpoint(weights, model_config):
    """A GPTQ or AWQ checkpoint (vllm/model_executor/layers/int_checkpoint.py): the weights
    iterator with each quantized layer dequantized to the model's dtype
    (vllm/model_executor/layers/int_dequant.py)."""
    from vllm.model_executor.layers.int_dequant import int_dequantized_weights

    fmt = model_config.checkpoint_int
    logger.info(
        "Dequantizing the checkpoint's %s weights (%s) to %s on load: no integer kernels "
        "here, so the model needs the unquantized model's memory",
        fmt.method.upper(),
        fmt.describe(),
        str(model_config.dtype).removeprefix("torch."),
    )
    return int_dequantized_weights(weights, fmt, model_config.dtype)
