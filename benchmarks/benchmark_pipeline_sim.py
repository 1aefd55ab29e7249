"""Pipeline simulator: the real engine, scheduler, executor (mp on gloo, or Ray) and stage
workers, with each stage's forward replaced by a stand-in that occupies a simulated device
for a configured time (``--load-format sim``, vllm/model_executor/model_loader/sim_model.py)
and returns zeros of the real shapes, so what is measured is the pipeline itself: bubbles,
host work, transfers.

The simulated device is asynchronous, like a CUDA stream: a forward is launched and
returns at once, its work runs on a per-stage device clock (from max(now, device free,
inputs ready) for its device time), and the host waits only where it reads a result (the
last stage's sampled ids: every pass of a one-step call, the last pass of a multi-step
call, whose other passes feed their ids to the next on the device). Hidden states sent to
the next stage, and ids sent back to stage 0, carry their ready time, so a stage's forward
never starts before its inputs exist. PP = 1 runs the same model, so the ratios between
PP sizes compare like with like.

Default conditions: the weight-bound regime of decode: 8 ms per step for the whole model,
whatever the row count (8 / P ms per stage at PP = P), 256 requests of 16 prompt tokens
and 128 output tokens (ignore_eos), virtual engines = PP. With the requests split over
the P virtual engines and a fixed time per step, the device-bound ceiling is the same
256 tokens per 8 ms at every PP size (each stage runs P passes of 8 / P ms per 256
tokens); a PP size gains over PP = 1 only by hiding the host time that PP = 1 spends
between its steps.

One JSON line per run (``{"bench": "pipeline_sim", ...}``):

- ``pp``, ``virtual_engines``, ``executor``, ``num_scheduler_steps``, ``requests``,
  ``output_len``, ``step_ms``;
- ``steps``: scheduler calls (one per VE step; a multi-step call counts once),
  ``passes``: forward passes of stage 0;
- ``wall_s``, ``tokens_per_s`` (output tokens / wall);
- ``stage_busy``: per stage, simulated device seconds / wall (the device's busy fraction);
- ``stage_device_s``: per stage, the simulated device seconds themselves (set by the
  configured times and the pass count alone, so the same on every machine);
- ``host_ms_per_step``: per scheduler call, ``schedule`` and ``process_outputs`` (the
  engine), ``submit`` (pickling and writing the request to the stages), and the stages'
  ``prepare``, ``transfer``, ``sample`` (the largest over stages; ``transfer`` includes a
  receiver's wait for its sender);
- ``stage_ms_per_step``: the same split per stage, and ``device_wait``: the host's waits
  for its device (inside ``sample`` on the last stage); ``forward`` is the launch only;
- ``cpu_cores_used``: CPU seconds (user + system) / wall of the engine process, then of
  each stage process (mp executor), over the timed run: how much of the machine's cores
  the run itself takes;
- ``load_avg_1m``: the machine's load average at the end (on a shared CPU, other load
  delays every process's wake-up, the stand-in's included, so compare runs of one load).

``--engine async`` runs the workload through ``AsyncLLMEngine`` (``vllm serve``'s engine)
instead, every request its own stream; its lines have ``"engine": "async"`` and no host
split. ``calls_at_once``: the most calls stage 0 held at once (mp executor, which streams
calls, vllm/worker/pp_stream.py; above 1 the VEs' passes interleaved).

Example (every combination of the table in docs/benchmarks.md)::

    python benchmarks/benchmark_pipeline_sim.py --pp 1 2 4 --num-scheduler-steps 1 8
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.sampling_params import SamplingParams
from vllm.utils import FlexibleArgumentParser

HOST_KEYS = ("schedule", "submit", "prepare", "transfer", "sample", "process_outputs")


def write_sim_config(path: str, layers: int, hidden: int, vocab: int) -> str:
    """Write a Llama config.json (no weights: the stand-in needs none) under ``path``."""
    from transformers import LlamaConfig

    heads = max(1, hidden // 64)
    LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        vocab_size=vocab,
        max_position_embeddings=4096,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return path


class TimedEngine(LLMEngine):
    """LLMEngine that accumulates the engine's own host time per phase."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.host = {"schedule": 0.0, "submit": 0.0, "process_outputs": 0.0}
        self.calls = 0
        submit = self.executor.execute_model_async

        def timed_submit(request):
            t0 = time.perf_counter()
            fut = submit(request)
            self.host["submit"] += time.perf_counter() - t0
            self.calls += len(request) if isinstance(request, list) else 1
            return fut

        self.executor.execute_model_async = timed_submit

    def schedule_step(self, ve):
        t0 = time.perf_counter()
        out = super().schedule_step(ve)
        self.host["schedule"] += time.perf_counter() - t0
        return out

    def apply_outputs(self, *args, **kwargs):  # process_outputs' first half
        t0 = time.perf_counter()
        out = super().apply_outputs(*args, **kwargs)
        self.host["process_outputs"] += time.perf_counter() - t0
        return out

    def finish_report(self, ve, report):  # and its second half
        t0 = time.perf_counter()
        out = super().finish_report(ve, report)
        self.host["process_outputs"] += time.perf_counter() - t0
        return out

    def reset_times(self) -> None:
        self.host = dict.fromkeys(self.host, 0.0)
        self.calls = 0
        self.executor.collective_rpc("reset_stage_times")


def _cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU seconds of each process so far (Linux /proc; 0.0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / tick)  # utime + stime
        except OSError:
            out.append(0.0)
    return out


def _generate(engine: LLMEngine, n: int, prompt_len: int, output_len: int, start: int) -> int:
    """Run ``n`` requests to completion; returns the output tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(n):
        prompt = [(start + i + j) % 1000 + 1 for j in range(prompt_len)]
        engine.add_request(f"r{start + i}", prompt, params)
    engine.stream_outputs = False
    tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += len(out.outputs[0].token_ids)
    return tokens


def _engine_args(args, model_dir: str, pp: int, steps: int) -> EngineArgs:
    """The engine of one simulated run: the stand-in model on ``pp`` stages."""
    extra = {"step_ms": args.step_ms, "per_row_us": args.per_row_us,
             "per_token_us": args.per_token_us}  # fmt: skip
    return EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        device="cpu",
        load_format="sim",
        model_loader_extra_config=json.dumps(extra),
        pipeline_parallel_size=pp,
        distributed_executor_backend=args.executor,
        num_scheduler_steps=steps,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.prompt_len + args.output_len + 8 * steps,
    )


def run_one(args, model_dir: str, pp: int, steps: int) -> dict:
    """One simulated run; returns its JSON record."""
    engine = TimedEngine.from_engine_args(_engine_args(args, model_dir, pp, steps))
    try:
        _generate(engine, pp, args.prompt_len, 4, 10**6)  # warm-up: start every stage
        engine.reset_times()
        pids = [os.getpid(), *getattr(engine.executor, "worker_pids", [])]
        cpu0 = _cpu_seconds(pids)
        t0 = time.perf_counter()
        tokens = _generate(engine, args.num_requests, args.prompt_len, args.output_len, 0)
        wall = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, _cpu_seconds(pids))]
        stages = engine.executor.collective_rpc("stage_times")
    finally:
        engine.shutdown()
    calls = max(1, engine.calls)
    per_stage = [{k: round(s[k] / calls * 1e3, 3) for k in ("prepare", "forward", "transfer",
                  "sample")} for s in stages]  # fmt: skip
    for split, s in zip(per_stage, stages):
        split["device_wait"] = round(s["device_wait_s"] / calls * 1e3, 3)
    host = {k: round(v / calls * 1e3, 3) for k, v in engine.host.items()}
    for k in ("prepare", "transfer", "sample"):
        host[k] = max(s[k] for s in per_stage)
    return {
        "bench": "pipeline_sim",
        "pp": pp,
        "virtual_engines": engine.config.num_virtual_engines,
        "executor": engine.config.parallel_config.distributed_executor_backend,
        "num_scheduler_steps": steps,
        "requests": args.num_requests,
        "output_len": args.output_len,
        "step_ms": args.step_ms,
        "steps": engine.calls,
        "passes": stages[0]["passes"],
        "calls_at_once": stages[0]["calls_at_once"],  # > 1: streamed calls interleaved
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "stage_busy": [round(s["device_busy_s"] / wall, 3) for s in stages],
        "stage_device_s": [round(s["device_busy_s"], 6) for s in stages],
        "host_ms_per_step": {k: host[k] for k in HOST_KEYS},
        "stage_ms_per_step": per_stage,
        "cpu_cores_used": [round(c / wall, 2) for c in cpu],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run_one_async(args, model_dir: str, pp: int, steps: int) -> dict:
    """The same workload through ``AsyncLLMEngine`` (``vllm serve``'s engine: each VE's
    calls submitted on their own, every request its own stream); its JSON record has no
    engine host split (``host_ms_per_step`` and ``stage_ms_per_step`` are absent)."""
    import asyncio

    from vllm.engine.async_llm_engine import AsyncLLMEngine

    async def generate(engine, n: int, output_len: int, start: int) -> int:
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)

        async def one(i: int) -> int:
            prompt = [(start + i + j) % 1000 + 1 for j in range(args.prompt_len)]
            tokens = 0
            request = {"prompt_token_ids": prompt}
            async for out in engine.generate(request, params, f"r{start + i}"):
                tokens = len(out.outputs[0].token_ids)
            return tokens

        return sum(await asyncio.gather(*(one(i) for i in range(n))))

    async def run() -> dict:
        engine = AsyncLLMEngine(_engine_args(args, model_dir, pp, steps), log_requests=False)
        executor = engine.engine.executor
        try:
            await generate(engine, pp, 4, 10**6)  # warm-up: start every stage
            executor.collective_rpc("reset_stage_times")
            pids = [os.getpid(), *getattr(executor, "worker_pids", [])]
            cpu0 = _cpu_seconds(pids)
            t0 = time.perf_counter()
            tokens = await generate(engine, args.num_requests, args.output_len, 0)
            wall = time.perf_counter() - t0
            cpu = [b - a for a, b in zip(cpu0, _cpu_seconds(pids))]
            stages = executor.collective_rpc("stage_times")
        finally:
            await engine.shutdown()
        return {
            "bench": "pipeline_sim", "engine": "async", "pp": pp, "virtual_engines": pp,
            "executor": args.executor, "num_scheduler_steps": steps,
            "requests": args.num_requests, "output_len": args.output_len,
            "step_ms": args.step_ms, "passes": stages[0]["passes"],
            "calls_at_once": stages[0]["calls_at_once"], "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "stage_busy": [round(s["device_busy_s"] / wall, 3) for s in stages],
            "cpu_cores_used": [round(c / wall, 2) for c in cpu],
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }  # fmt: skip

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every (pp, num_scheduler_steps) combination; print conditions and JSON lines."""
    p = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--num-scheduler-steps", type=int, nargs="+", default=[1, 8])
    p.add_argument("--executor", choices=["mp", "ray"], default="mp")
    p.add_argument(
        "--engine", choices=["sync", "async"], default="sync",
        help="LLMEngine (LLM's) or AsyncLLMEngine (vllm serve's)",
    )  # fmt: skip
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=8.0, help="whole-model ms per step")
    p.add_argument("--per-row-us", type=float, default=0.0)
    p.add_argument("--per-token-us", type=float, default=0.0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=2048)
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    print(
        f"pipeline sim: {os.cpu_count()} CPU cores, executor {args.executor}, model "
        f"{args.layers} layers x hidden {args.hidden}, vocab {args.vocab}; stand-in "
        f"{args.step_ms} ms + {args.per_row_us} us/row + {args.per_token_us} us/token per "
        f"step (whole model, / P per stage); {args.num_requests} requests x "
        f"{args.prompt_len} prompt + {args.output_len} output tokens",
        file=sys.stderr,
    )
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_sim_config(tmp, args.layers, args.hidden, args.vocab)
        for steps in args.num_scheduler_steps:
            for pp in args.pp:
                run = run_one_async if args.engine == "async" else run_one
                rec = run(args, model_dir, pp, steps)
                print(json.dumps(rec), flush=True)
                records.append(rec)
    return records


if __name__ == "__main__":
    main()
