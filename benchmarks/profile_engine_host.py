"""Host time of the in-process engine per multi-step decode call, by phase (CPU only).

On one GPU a multi-step decode call runs its passes on the device; then the device waits
while the host reads the sampled rows back, turns them into each sequence's tokens,
appends those (with stop checks), schedules the next call and prepares its inputs. At
large batches that gap is what separates this engine from its device time. This script
runs the real ``LLMEngine`` on the pipeline simulator's stand-in model (``--load-format
sim`` with no simulated device time; vllm/model_executor/model_loader/sim_model.py), so
what it times is the host work alone, per decode call, in four phases:

- ``schedule``: ``LLMEngine.schedule_step`` (the scheduler, slots for the call's steps);
- ``prepare``: ``ModelRunner.prepare_model_input`` (the call's first-step inputs);
- ``unpack``: the packed sample rows into ``SequenceOutput`` objects
  (``sampler_output``, in a one-step call or a multi-step one);
- ``apply``: ``LLMEngine.apply_outputs`` (append, stop checks, finished requests).

It also reports the garbage collector's time (``gc.callbacks``) and the wall time.
Workload: ``--num-requests`` requests of ``--prompt-len`` distinct token ids and
``--output-len`` greedy tokens (``ignore_eos``), all admitted at once; the first call
(their prefill) is not timed. Example::

    python benchmarks/profile_engine_host.py --num-scheduler-steps 8 16

Prints the conditions, then one JSON line per step count:
``{"bench": "engine_host", "num_scheduler_steps": ..., "ms_per_call": {...}, ...}``.
"""

from __future__ import annotations

import gc
import json
import platform
import tempfile
import time

import torch
from bench_common import emit, print_conditions
from benchmark_pipeline_sim import write_sim_config

import vllm.model_executor.layers.sampler as sampler
import vllm.worker.model_runner as model_runner
import vllm.worker.multi_step as multi_step
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.sampling_params import SamplingParams
from vllm.utils import FlexibleArgumentParser

PHASES = ("schedule", "prepare", "unpack", "apply")


class _PhaseTimer:
    """Wraps one function per phase, summing its wall time into ``seconds[phase]``; also
    sums the garbage collector's pauses. ``restore`` puts the originals back."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.gc_seconds = 0.0
        self._gc_start = 0.0
        self._undo = []
        self._wrap(LLMEngine, "schedule_step", "schedule")
        self._wrap(model_runner.ModelRunner, "prepare_model_input", "prepare")
        self._wrap(sampler, "sampler_output", "unpack")  # a one-step call's
        self._wrap(multi_step, "sampler_output", "unpack")  # a multi-step call's
        self._wrap(LLMEngine, "apply_outputs", "apply")
        gc.callbacks.append(self._on_gc)

    def _wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_start

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.gc_seconds = 0.0

    def restore(self) -> None:
        for owner, name, fn in self._undo:
            setattr(owner, name, fn)
        gc.callbacks.remove(self._on_gc)


def _add(engine: LLMEngine, n: int, prompt_len: int, output_len: int, start: int) -> None:
    sp = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(n):
        ids = [(start + i + j) % 1000 + 1 for j in range(prompt_len)]
        engine.add_request(f"r{start + i}", ids, sp)


def run_one(args, model_dir: str, steps: int) -> dict:
    """One engine at ``steps`` scheduler steps: a short warm-up, then the timed run."""
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=model_dir,
            skip_tokenizer_init=True,
            device="cpu",
            load_format="sim",
            model_loader_extra_config=json.dumps({"step_ms": 0.0}),
            num_scheduler_steps=steps,
            max_num_seqs=args.num_requests,
            max_model_len=args.prompt_len + args.output_len,
            max_num_batched_tokens=max(2048, args.num_requests * args.prompt_len),
        )
    )
    engine.stream_outputs = False  # as LLM.generate: outputs of finished requests only
    _add(engine, 8, args.prompt_len, steps, start=10**6)
    while engine.has_unfinished_requests():
        engine.step()
    timer = _PhaseTimer()
    try:
        _add(engine, args.num_requests, args.prompt_len, args.output_len, start=0)
        engine.step()  # the prefill call
        timer.reset()
        calls, t0 = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            calls += 1
        wall = time.perf_counter() - t0
    finally:
        timer.restore()
        engine.shutdown()
    per_call = {k: round(v / calls * 1e3, 3) for k, v in timer.seconds.items()}
    return {
        "bench": "engine_host",
        "num_scheduler_steps": steps,
        "requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "calls": calls,
        "ms_per_call": per_call,
        "host_ms_per_call": round(sum(per_call.values()), 3),
        "gc_ms_per_call": round(timer.gc_seconds / calls * 1e3, 3),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(args.num_requests * (args.output_len - 1) / wall, 1),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-scheduler-steps", type=int, nargs="+", default=[8, 16])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--output-len", type=int, default=257)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--output-json", default=None, help="append the JSON lines here too.")
    args = p.parse_args(argv)
    if args.output_len < 2:
        raise ValueError(f"--output-len must be at least 2 (a decode call), got {args.output_len}.")
    print_conditions(
        "profile_engine_host conditions",
        {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "torch threads": torch.get_num_threads(),
            "stand-in model": f"{args.layers} layers, hidden {args.hidden}, vocab {args.vocab}",
            "requests": f"{args.num_requests} x ({args.prompt_len} in, {args.output_len} out)",
        },
    )
    records = []
    with tempfile.TemporaryDirectory() as d:
        model_dir = write_sim_config(d, args.layers, args.hidden, args.vocab)
        for steps in args.num_scheduler_steps:
            record = run_one(args, model_dir, steps)
            emit(record, args.output_json)
            records.append(record)
    return records


if __name__ == "__main__":
    main()
