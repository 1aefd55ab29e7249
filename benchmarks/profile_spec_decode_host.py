"""Host work of a speculative decode step outside the model forward (runs on CPU too).

Runs the ``repetitive`` prompts of benchmark_spec_decode.py one at a time (batch 1, greedy,
EOS ignored) through n-gram (or draft-model) speculation and reports, per *speculative*
step (a step whose scorer ran) and per plain decode step:

- ``transfers``: device-to-host reads (``Tensor.tolist``/``item``/``bool``/``cpu``/
  ``numpy``: each a full synchronisation on CUDA) and host-data tensors created in the step
  (``torch.tensor(list)``: on CUDA an upload, which synchronises the stream unless staged in
  pinned memory as ``vllm.utils.to_device`` does), each with its call site;
- ``ops``: aten ops dispatched outside the model forward (runner.forward_hidden and the
  model's compute_logits), i.e. the kernels a CUDA step launches besides the model's, by
  the vllm file that issued them (the CPU attention backend's metadata is built on CUDA
  only for eager steps: a replayed graph refills its own); ``kernel_ops`` leaves out views
  and other ops that launch nothing on CUDA;
- ``host_ms``: wall time of the worker's execute_model minus the model forward, from a run
  without the op counter (``--threads 1`` steadies it on a shared CPU).

Then a cProfile of one prompt, top functions by cumulative time. Example (CPU)::

    python benchmarks/profile_spec_decode_host.py --device cpu --dtype float32 \
        --output-len 64
"""

from __future__ import annotations

import collections
import cProfile
import io
import json
import pstats
import time
import traceback

import torch
from bench_common import default_model
from benchmark_spec_decode import REPETITIVE
from torch.utils._python_dispatch import TorchDispatchMode

from vllm import LLM, SamplingParams
from vllm.utils import FlexibleArgumentParser


class _State:
    def __init__(self):
        self.in_step = False
        self.in_model = 0
        self.model_s = 0.0
        self.ops: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()


ST = _State()
# aten ops that launch nothing on CUDA (views, metadata, the host side of torch.tensor)
_NO_KERNEL = {
    "detach_", "select", "slice", "unsqueeze", "squeeze", "view", "expand", "split",
    "split_with_sizes", "resolve_conj", "resolve_neg", "lift_fresh", "is_nonzero", "t",
}  # fmt: skip


def _launches(op: str) -> bool:
    return op.split(": aten.")[-1].split(".")[0] not in _NO_KERNEL


def _site() -> str:
    for fr in reversed(traceback.extract_stack()[:-2]):
        if "/vllm/" in fr.filename and "/torch/" not in fr.filename:
            return f"{fr.filename.split('/vllm/')[-1]}:{fr.lineno}"
    return "?"


class _OpCounter(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if ST.in_step and not ST.in_model:
            name = str(func)
            site = _site()
            ST.ops[f"{site.split(':')[0]}: {name}"] += 1
            if name == "aten.lift_fresh.default":
                ST.syncs[f"host tensor @ {site}"] += 1
        return func(*args, **(kwargs or {}))


def _wrap_d2h(name: str) -> None:
    orig = getattr(torch.Tensor, name)

    def wrapped(self, *a, **kw):
        if ST.in_step and not ST.in_model:
            ST.syncs[f"{name} @ {_site()}"] += 1
        return orig(self, *a, **kw)

    setattr(torch.Tensor, name, wrapped)


def _model_part(fn):
    def wrapped(*a, **kw):
        ST.in_model += 1
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            ST.model_s += time.perf_counter() - t0
            ST.in_model -= 1

    return wrapped


def _instrument(llm: LLM) -> list:
    """Time and count the worker's decode steps; returns the list records go to."""
    worker = llm.llm_engine.executor.worker
    runners = [worker.target.model_runner]
    if getattr(worker, "draft_worker", None) is not None:
        runners.append(worker.draft_worker.model_runner)
    for r in runners:
        r.forward_hidden = _model_part(r.forward_hidden)
        r.model.compute_logits = _model_part(r.model.compute_logits)
    for name in ("tolist", "item", "__bool__", "cpu", "numpy"):
        _wrap_d2h(name)
    records = []  # (kind, host_s, model_s, ops, syncs)
    orig = worker.execute_model

    def execute_model(request):
        mds = request.seq_group_metadata_list
        decode = bool(mds) and not mds[0].is_prompt
        before = worker.metrics.num_spec_steps
        ST.ops, ST.syncs, ST.model_s = collections.Counter(), collections.Counter(), 0.0
        ST.in_step = decode
        t0 = time.perf_counter()
        try:
            return orig(request)
        finally:
            wall = time.perf_counter() - t0
            ST.in_step = False
            if decode:
                kind = "spec" if worker.metrics.num_spec_steps > before else "plain"
                records.append((kind, wall - ST.model_s, ST.model_s, ST.ops, ST.syncs))

    worker.execute_model = execute_model
    return records


def _summary(records: list, kind: str) -> dict:
    rows = [r for r in records if r[0] == kind]
    if not rows:
        return {"steps": 0}
    n = len(rows)
    ops: collections.Counter = collections.Counter()
    syncs: collections.Counter = collections.Counter()
    for r in rows:
        ops.update(r[3])
        syncs.update(r[4])
    return {
        "steps": n,
        "host_ms": round(sum(r[1] for r in rows) * 1e3 / n, 3),
        "model_ms": round(sum(r[2] for r in rows) * 1e3 / n, 3),
        "ops_per_step": round(sum(ops.values()) / n, 2),
        "kernel_ops_per_step": round(sum(v for k, v in ops.items() if _launches(k)) / n, 2),
        "transfers_per_step": round(sum(syncs.values()) / n, 2),
        "ops": {k: round(v / n, 2) for k, v in ops.most_common()},
        "syncs": {k: round(v / n, 2) for k, v in syncs.most_common()},
    }


def main(argv: list[str] | None = None) -> dict:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model())
    p.add_argument("--speculative-model", default="[ngram]")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--logprobs", type=int, default=None)
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads after start-up (CPU timing)"
    )
    args = p.parse_args(argv)
    llm = LLM(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=1024,
        speculative_model=args.speculative_model,
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_prompt_lookup_max=4,
        disable_log_stats=True,
    )
    sp = SamplingParams(
        temperature=0, max_tokens=args.output_len, ignore_eos=True, logprobs=args.logprobs
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    llm.generate(REPETITIVE[:1], sp, use_tqdm=False)  # warm-up
    records = _instrument(llm)
    t0 = time.perf_counter()
    for prompt in REPETITIVE:
        llm.generate([prompt], sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    timed = list(records)
    records.clear()
    with _OpCounter():
        for prompt in REPETITIVE:
            llm.generate([prompt], sp, use_tqdm=False)
    counted = list(records)
    records.clear()
    out = {"bench": "profile_spec_decode_host", "ms_per_token": None}
    out["ms_per_token"] = round(wall * 1e3 / (len(REPETITIVE) * args.output_len), 3)
    for kind in ("spec", "plain"):
        t = _summary(timed, kind)
        c = _summary(counted, kind)
        out[kind] = {
            "steps": t["steps"],
            "host_ms": t.get("host_ms"),
            "model_ms": t.get("model_ms"),
            "ops_per_step": c.get("ops_per_step"),
            "kernel_ops_per_step": c.get("kernel_ops_per_step"),
            "transfers_per_step": c.get("transfers_per_step"),
        }
        print(f"== {kind} steps: {json.dumps(out[kind])}")
        print("   transfers:", json.dumps(c.get("syncs", {}), indent=1))
        kernels = {k: v for k, v in c.get("ops", {}).items() if _launches(k)}
        print("   kernel ops by file:", json.dumps(kernels, indent=1))
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(REPETITIVE[:1], sp, use_tqdm=False)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.top)
    print(buf.getvalue())
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
