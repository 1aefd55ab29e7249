"""Where a decode step's time goes: host phases, CUDA kernels per step, and a cProfile.

Runs ``--batch-size`` random token-id prompts of ``--input-len`` tokens for ``--output-len``
greedy tokens (one warm-up batch first), then a second batch under ``torch.profiler``
(CPU and CUDA activities) and a third under ``cProfile``. Prints:

- the run conditions and the wall time per decode step of the plain timed batch;
- the top kernels by total CUDA time, and kernels launched per engine step;
- the top host functions by own time (cProfile), which shows Python overhead;
- the GPU timeline of the profiled batch: the union of kernel intervals (busy), the idle
  time between kernels, and the idle gaps of at least ``--gap-us`` (the host between
  multi-step windows shows up there: one gap per window);
- one JSON line ``{"bench": "profile_decode", ...}`` with ms per step, CUDA-busy ms per
  step (sum of kernel times / steps), kernels per step, and the timeline's busy / idle ms
  per step and long gaps.

A step whose CUDA-busy time is far below its wall time is host-bound. Example (H200)::

    python benchmarks/profile_decode.py --batch-size 1 --output-len 64
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

from bench_common import default_model, emit, engine_conditions, print_conditions, sync

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.utils import FlexibleArgumentParser


def main() -> None:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model())
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--top", type=int, default=25, help="Rows per printed table.")
    p.add_argument("--gap-us", type=float, default=50.0, help="Idle gaps counted as long.")
    p.add_argument(
        "--cprofile-sort",
        default="tottime",
        help="Comma-separated pstats sort keys; one cProfile table per key (e.g. tottime,cumtime).",
    )
    p.add_argument(
        "--table-sort",
        default=None,
        help="torch.profiler table sort key (default: self CUDA time on CUDA, else self CPU).",
    )
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
    timeline = _timeline(prof, args.gap_us) if cond["device"] == "cuda" else {}
    events = prof.key_averages()
    # Kernel events only: a CPU op's self_device_time_total repeats the time of the kernels
    # it launched, so adding those too would count each kernel twice.
    kernel_events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    cuda_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in kernel_events)
    kernels = sum(e.count for e in kernel_events)
    sort = args.table_sort or (
        "self_cuda_time_total" if cond["device"] == "cuda" else "self_cpu_time_total"
    )
    print(events.table(sort_by=sort, row_limit=args.top, max_name_column_width=60))

    pr = cProfile.Profile()
    pr.enable()
    llm.generate(prompts, sp, use_tqdm=False)
    sync(cond["device"])
    pr.disable()
    for key in args.cprofile_sort.split(","):
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(args.top)
        print(buf.getvalue())
    steps = args.output_len
    emit(
        {
            "bench": "profile_decode",
            **cond,
            "ms_per_step": round(ms_per_step, 4),
            "cuda_busy_ms_per_step": round(cuda_us / 1e3 / steps, 4),
            "kernels_per_step": round(kernels / steps, 1),
            **{k: round(v / steps, 4) if k.endswith("_ms") else v for k, v in timeline.items()},
        }
    )


def _timeline(prof, gap_us: float) -> dict:
    """The profiled run's GPU timeline from its kernel intervals (microseconds).

    PDL kernels overlap their predecessor, so busy time is the union of the intervals, not
    their sum. Returns busy_ms and idle_ms (first kernel start to last kernel end), and the
    count / total ms / largest us of the idle gaps of at least ``gap_us``.
    """
    import torch

    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return {}
    busy = 0.0
    gaps: list[float] = []
    cur_start, cur_end = spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start = start
        cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    long_gaps = [g for g in gaps if g >= gap_us]
    out = {
        "busy_ms": busy / 1e3,
        "idle_ms": sum(gaps) / 1e3,
        "long_gaps": len(long_gaps),
        "long_gap_ms": sum(long_gaps) / 1e3,
        "largest_gap_us": round(max(gaps, default=0.0), 1),
    }
    print(f"GPU timeline: {out['busy_ms']:.3f} ms busy, {out['idle_ms']:.3f} ms idle; "
          f"{len(long_gaps)} gaps >= {gap_us:g} us, {out['long_gap_ms']:.3f} ms")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
