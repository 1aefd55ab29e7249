"""Pipeline-parallel throughput: PP=2 against PP=1 on the same GPUs, with each GPU's busy time.

For each ``--pp`` size, ``benchmark_throughput.py`` runs in a fresh process (the fixed
workload: ``--num-prompts`` requests of ``--input-len`` tokens generating ``--output-len``),
while ``nvidia-smi`` samples every GPU's utilization (the fraction of the sample period in
which a kernel ran) every ``--sample-ms``. Reported, one JSON line per PP size
(``{"bench": "pipeline_parallel", ...}``): output tokens/s, ``speedup_vs_pp1`` and
``gpu_busy`` (mean utilization per GPU index, 0-1, over the samples taken inside the timed
runs' window, which benchmark_throughput reports as ``timed_window_epoch_s``; start-up,
model load and graph capture are outside it). Keep ``--sample-ms`` well below the timed
run's length (a run of ~1 s gets ~10 samples at the default 100 ms). Example (2 x H200)::

    python benchmarks/benchmark_pipeline_parallel.py --model benchmarks/configs/llama-3.1-8b
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_common import run_against_baseline

from vllm.utils import FlexibleArgumentParser

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_util(lines: list[str], window: tuple[float, float] | None = None) -> dict[int, float]:
    """Mean utilization (0-1) per GPU index from ``nvidia-smi --query-gpu=timestamp,index,
    utilization.gpu --format=csv,noheader,nounits`` lines ("2026/11/29 23:00:01.123, 0, 87");
    with ``window`` (epoch seconds, local time), only the samples inside it count."""
    acc: dict[int, list[float]] = {}
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            frac = float(parts[0].split(".")[1]) / 1000 if "." in parts[0] else 0.0
            util = float(parts[2]) / 100.0
        except ValueError:
            continue
        if window is not None and not window[0] <= stamp + frac <= window[1]:
            continue
        acc.setdefault(int(parts[1]), []).append(util)
    return {i: round(sum(v) / len(v), 3) for i, v in sorted(acc.items()) if v}


def run_one(pp: int, args: argparse.Namespace) -> dict:
    """One benchmark_throughput process at pipeline size ``pp``; its record plus busy."""
    out = tempfile.NamedTemporaryFile("w+", suffix=".jsonl", delete=False).name
    cmd = [
        sys.executable, os.path.join(HERE, "benchmark_throughput.py"),
        "--model", args.model, "--load-format", args.load_format, "--skip-tokenizer-init",
        "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
        "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
        "--output-len", str(args.output_len), "--pipeline-parallel-size", str(pp),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--no-tqdm", "--output-json", out,
    ]  # fmt: skip
    # nvidia-smi writes to a file, not a pipe: a pipe nobody reads fills up (64 KiB, about
    # 100 s of samples) and blocks nvidia-smi before the timed window of a slow start-up.
    with tempfile.TemporaryFile("w+") as samples:
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
             "--format=csv,noheader,nounits", f"-lms={args.sample_ms}"],
            stdout=samples, text=True,
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            subprocess.run(cmd, check=True)
        finally:
            smi.terminate()
            smi.wait(timeout=10)
        samples.seek(0)
        util_lines = samples.read().splitlines()
    with open(out) as fh:
        rec = json.loads(fh.read().strip().splitlines()[-1])
    os.unlink(out)
    rec.update(
        bench="pipeline_parallel",
        pipeline_parallel_size=pp,
        wall_s_incl_startup=round(time.perf_counter() - t0, 2),
        gpu_busy=parse_util(util_lines, rec.get("timed_window_epoch_s")),
    )
    return rec


def main(argv: list[str] | None = None) -> list[dict]:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(HERE, "configs", "qwen2.5-1.5b"))
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--pp", default="1,2", help="Pipeline sizes to run, comma-separated.")
    p.add_argument("--sample-ms", type=int, default=100)
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    print(f"==== benchmark_pipeline_parallel: {vars(args)} ====", flush=True)
    sizes = [int(x) for x in args.pp.split(",")]
    run = functools.partial(run_one, args=args)
    return run_against_baseline(sizes, run, 1, "speedup_vs_pp1", args.output_json)


if __name__ == "__main__":
    main()
