"""The one start-up summary line that the offline ``LLM`` and ``vllm serve`` both log.

Each stage reports what it chose (:func:`stage_summary`, a plain dict so it can cross a
process boundary from mp or Ray workers); :func:`format_summary` joins the stages into one
line with the fields a user checks first::

    Start-up summary: device=cuda:0 (NVIDIA H200), dtype=bfloat16, attention=FLASHINFER,
    kv_cache=21504 blocks x 16 tokens per virtual engine (10.51 GiB),
    graphs=46 captured in 2.94 s (0.40 GiB), parallel=pp 1 x tp 1 (uni executor,
    1 virtual engine)

(one line in the log). Piecewise graphs add ``and N piecewise sizes`` (each size is one
graph per piece: layers + 1). Without graphs, ``graphs=eager (<why>)``. Speculative
decoding and fp8 weights add ``speculation=...`` and ``quantization=fp8 (...)``; an fp8,
GPTQ or AWQ checkpoint dequantized on load adds ``quantization=none (...)``; an 8-bit KV
cache names its dtype after the GiB (``(5.25 GiB in fp8)``).
"""

from __future__ import annotations

from typing import Any


def _graph_count(
    graph_runner: Any,
    num_virtual_engines: int,
    kinds: tuple[str, ...] = ("decode", "prefill", "loop"),
) -> int:
    """Sizes a graph runner captured of ``kinds`` over every VE: by default its decode,
    prefill and decode-loop graphs (one graph each); ``("piecewise",)`` counts piecewise
    token counts (each one graph per piece)."""
    return sum(
        len(graph_runner.captured_sizes(ve, kind))
        for ve in range(num_virtual_engines)
        for kind in kinds
    )


def stage_summary(worker: Any) -> dict[str, Any]:
    """What one stage's worker chose, after its KV cache and graphs exist.

    Args:
        worker: a Worker (or SpecDecodeWorker: its target's runner and caches are read).

    Returns:
        rank, device (with the GPU name or CPU thread count), dtype, attention backend,
        layers [start, end), KV bytes over every virtual engine's cache, and the graphs:
        count, piecewise sizes, capture seconds, capture bytes (0, 0, 0.0, 0 when none
        were captured).
    """
    import torch

    device: torch.device = worker.device
    runner = worker.model_runner
    if device.type == "cuda":
        where = f"{device} ({torch.cuda.get_device_name(device)})"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    graphs = runner.graph_runner
    ves = len(worker.cache_engines)
    kv_bytes = sum(
        t.numel() * t.element_size() for ce in worker.cache_engines for t in ce.kv_caches
    )
    return {
        "rank": runner.pp_rank,  # the pipeline stage (TP ranks of a stage share it)
        "device": where,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "attention": runner.attn_backend_name,
        "layers": (runner.model.start_layer, runner.model.end_layer),
        "kv_bytes": kv_bytes,
        "graphs": _graph_count(graphs, ves) if graphs is not None else 0,
        "piecewise": _graph_count(graphs, ves, ("piecewise",)) if graphs is not None else 0,
        "graph_seconds": graphs.capture_seconds if graphs is not None else 0.0,
        "graph_bytes": graphs.capture_bytes if graphs is not None else 0,
    }


def _eager_reason(config: Any) -> str:
    if config.device_config.device != "cuda":
        return "CUDA graphs need a CUDA device"
    if config.compilation_config.enforce_eager:
        return "--enforce-eager"
    return "no capture sizes"


def format_summary(config: Any, stages: list[dict[str, Any]]) -> str:
    """One line from the engine config and every stage's :func:`stage_summary` (rank order).

    Fields: device, dtype, attention, kv_cache (blocks per virtual engine, tokens per
    block, GiB over all stages, and the cache dtype when it is not the model's), graphs
    (count, piecewise sizes when any, seconds, GiB; or eager and why), parallel (pipeline x
    tensor parallel sizes, executor, virtual engines, and each stage's device and layers
    when there are several), and speculation (proposer and k) when it is on.
    """
    first = stages[0]
    devices = sorted({s["device"] for s in stages})
    cc = config.cache_config
    kv_gib = sum(s["kv_bytes"] for s in stages) / 2**30
    count = sum(s["graphs"] for s in stages)
    pieces = sum(s["piecewise"] for s in stages)
    if count or pieces:
        seconds = max(s["graph_seconds"] for s in stages)
        gib = sum(s["graph_bytes"] for s in stages) / 2**30
        also = f" and {pieces} piecewise sizes" if pieces else ""
        graphs = f"{count} captured{also} in {seconds:.2f} s ({gib:.2f} GiB)"
    else:
        graphs = f"eager ({_eager_reason(config)})"
    pc = config.parallel_config
    ves = config.num_virtual_engines
    parallel = (
        f"pp {pc.pipeline_parallel_size} x tp {pc.tensor_parallel_size} "
        f"({pc.distributed_executor_backend} executor, {ves} virtual engine{'s' * (ves > 1)}"
    )
    if pc.pipeline_parallel_size > 1:  # one entry per stage (its TP ranks share the layers)
        per_stage = stages[:: pc.tensor_parallel_size]
        parts = [
            f"stage {s['rank']} layers {s['layers'][0]}-{s['layers'][1] - 1}" for s in per_stage
        ]
        parallel += "; " + ", ".join(parts)
    parallel += ")"
    return (
        f"Start-up summary: device={', '.join(devices)}, dtype={first['dtype']}, "
        f"attention={first['attention']}, kv_cache={cc.num_gpu_blocks} blocks x "
        f"{cc.block_size} tokens per virtual engine ({kv_gib:.2f} GiB{_kv_dtype(cc)}), "
        f"graphs={graphs}, "
        f"parallel={parallel}{_speculation(config)}{_quantization(config)}"
    )


def _kv_dtype(cache_config: Any) -> str:
    """`` in <kv_cache_dtype>`` (as given, e.g. `` in fp8``) for an 8-bit cache, else ""."""
    name = cache_config.cache_dtype
    return "" if name == "auto" else f" in {name}"


def _quantization(config: Any) -> str:
    """``, quantization=fp8 (...)`` naming what holds fp8 weights, ``, quantization=none
    (...)`` for an fp8, GPTQ or AWQ checkpoint dequantized on load, or "" without either."""
    mc = getattr(config, "model_config", None)
    dequantized = getattr(mc, "checkpoint_dequantized", None)
    if dequantized:
        dequantized = f"fp8 checkpoint dequantized: {dequantized}"
    ints = getattr(mc, "checkpoint_int", None)
    if ints is not None:  # no integer kernels: the unquantized model's memory
        dequantized = (
            f"{ints.method} checkpoint dequantized: {ints.describe()}; the unquantized "
            "model's memory, no integer kernels"
        )
    if getattr(mc, "quantization", None) != "fp8":
        return f", quantization=none ({dequantized})" if dequantized else ""
    source = mc.checkpoint_quantization or "on load"
    if dequantized:
        source = f"on load, of the {dequantized}"
    return f", quantization=fp8 (decoder projections; {source})"


def _speculation(config: Any) -> str:
    """``, speculation=...`` naming the proposer and k, or "" without speculation."""
    spec = getattr(config, "speculative_config", None)
    if spec is None:
        return ""
    k = spec.num_speculative_tokens
    if spec.is_ngram:
        lo, hi = spec.ngram_prompt_lookup_min, spec.ngram_prompt_lookup_max
        return f", speculation=ngram k={k} (n-grams {lo}-{hi})"
    return f", speculation=draft {spec.speculative_model} k={k}"
