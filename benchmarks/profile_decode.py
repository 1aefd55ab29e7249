"""Where a decode step's time goes: host phases, CUDA kernels per step, and a cProfile.

Runs ``--batch-size`` random token-id prompts of ``--input-len`` tokens for ``--output-len``
greedy tokens (one warm-up batch first), then a second batch under ``torch.profiler``
(CPU and CUDA activities) and a third under ``cProfile``. Prints:

- the run conditions and the wall time per decode step of the plain timed batch;
- the top kernels by total CUDA time, and kernels launched per engine step;
- the top host functions by own time (cProfile), which shows Python overhead;
- one JSON line ``{"bench": "profile_decode", ...}`` with ms per step, CUDA-busy ms per
  step (sum of kernel times / steps) and kernels per step.

A step whose CUDA-busy time is far below its wall time is host-bound. Example (H200)::

    python benchmarks/profile_decode.py --batch-size 1 --output-len 64
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from bench_common import default_model, emit, engine_conditions, print_conditions, sync

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model())
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--top", type=int, default=25, help="Rows per printed table.")
    EngineArgs.add_cli_args(p)
    args = p.parse_args()
    import torch

    engine_args = EngineArgs.from_cli_args(args)
    engine_args.max_num_seqs = max(engine_args.max_num_seqs, args.batch_size)
    kwargs = {k: v for k, v in vars(engine_args).items() if k != "model"}
    kwargs["disable_log_stats"] = True
    llm = LLM(model=args.model, **kwargs)
    cond = engine_conditions(llm)
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(args.input_len)]}
               for i in range(args.batch_size)]  # fmt: skip
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up
    sync(cond["device"])
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    sync(cond["device"])
    ms_per_step = (time.perf_counter() - t0) * 1e3 / args.output_len
    cond.update(
        batch_size=args.batch_size,
        input_len=args.input_len,
        output_len=args.output_len,
        warmup="1 batch",
    )
    print_conditions("profile_decode conditions", cond)
    print(f"wall: {ms_per_step:.3f} ms per engine step (prefill included once)")

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cond["device"] == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        llm.generate(prompts, sp, use_tqdm=False)
        sync(cond["device"])
    events = prof.key_averages()
    # Kernel events only: a CPU op's self_device_time_total repeats the time of the kernels
    # it launched, so adding those too would count each kernel twice.
    kernel_events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    cuda_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in kernel_events)
    kernels = sum(e.count for e in kernel_events)
    sort = "self_cuda_time_total" if cond["device"] == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=args.top, max_name_column_width=60))

    pr = cProfile.Profile()
    pr.enable()
    llm.generate(prompts, sp, use_tqdm=False)
    sync(cond["device"])
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(args.top)
    print(buf.getvalue())
    steps = args.output_len
    emit(
        {
            "bench": "profile_decode",
            **cond,
            "ms_per_step": round(ms_per_step, 4),
            "cuda_busy_ms_per_step": round(cuda_us / 1e3 / steps, 4),
            "kernels_per_step": round(kernels / steps, 1),
        }
    )


if __name__ == "__main__":
    main()
