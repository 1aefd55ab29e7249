"""Side by side with upstream vLLM: the same token-id workloads through vLLM's public API.

The script uses only what both engines export (``vllm.LLM``, ``vllm.SamplingParams``,
``{"prompt_token_ids": [...]}`` prompts, ``LLM.generate``), so one file runs under either
engine. Run it twice, in separate processes, in the same lease: once with upstream vLLM
first on ``PYTHONPATH`` (from a directory that has no ``vllm/`` folder), once with this
checkout. It checks which ``vllm`` it imported (upstream ships the V1 engine in
``vllm/v1/``; this engine has ``vllm/cudagraph/decode_loop.py``) and, with
``--expect-engine``, refuses to run under the other one.

Workloads (``--workloads``, default ``1,8,64,nano``):

- ``B`` (an integer): B requests of ``--input-len`` (128) prompt tokens, exactly
  ``--output-len`` (128) new tokens each, submitted together.
- ``nano``: nano-vllm's ``bench.py`` workload: ``--num-prompts`` (256) requests, prompt and
  output lengths uniform in [100, 1024] from ``random.Random(--seed)`` (0); the same
  requests as ``benchmark_throughput.py --dataset random-range``.

Every request is greedy with ``ignore_eos``, so the work is the sum of the output lengths;
output text is decoded too, except with dummy weights (no tokenizer: ``detokenize=False``).
Token ids are uniform in [0, vocab_size) (config.json). Before each workload, a warm-up
run of the same shapes with other token ids; each timed iteration uses fresh ids too, so
prefix caching (on by default upstream) finds nothing to reuse.

Engine flags: upstream runs with its defaults; this engine with the flags the README
recommends for offline throughput (``num_scheduler_steps=32``,
``max_num_batched_tokens=16384``); ``--engine-kwargs``
replaces either. Both get the shared flags (model, dtype, load format, max_model_len, ...).
Every JSON line states the engine, its version, the module it came from and the full
keyword arguments given to ``LLM``.

    PYTHONPATH=/tmp/vsite python benchmarks/benchmark_vs_upstream.py --expect-engine upstream \\
        --model /tmp/smollm2-bf16 --workloads 1,8,64
    python benchmarks/benchmark_vs_upstream.py --expect-engine fork --model /tmp/smollm2-bf16 \\
        --workloads 1,8,64
    python benchmarks/benchmark_vs_upstream.py --model benchmarks/configs/qwen2.5-0.5b \\
        --load-format dummy --workloads nano

``--summarize FILE`` prints one ratio line per (model, workload) of a results file that
both engines appended to. benchmarks/convert_gguf_to_hf.py writes the SmolLM2 GGUF as a
bf16 HF directory; ``run_gpu_suite.sh bench upstream`` runs all of it, and serving.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from typing import Any

from bench_common import run_script, setup_checks

try:  # upstream moved it to vllm.utils.argparse_utils (this fork has both)
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # an older upstream
    from vllm.utils import FlexibleArgumentParser

# This engine's offline flags from the README ("GPU quick start"); upstream keeps its defaults.
DEFAULT_ENGINE_KWARGS = {
    "fork": {"num_scheduler_steps": 32, "max_num_batched_tokens": 16384},
    "upstream": {},
}


def detect_engine() -> dict[str, str]:
    """Which ``vllm`` this process imports: ``{"engine": "fork" | "upstream", "version",
    "module"}`` (module: the package directory).

    Raises:
        RuntimeError: the imported package is neither (no ``v1/`` and no
            ``cudagraph/decode_loop.py``).
    """
    import vllm

    path = os.path.dirname(os.path.abspath(vllm.__file__))
    if os.path.isfile(os.path.join(path, "cudagraph", "decode_loop.py")):
        engine = "fork"
    elif os.path.isdir(os.path.join(path, "v1")):
        engine = "upstream"
    else:
        raise RuntimeError(f"unrecognised vllm package at {path}: neither upstream nor the fork")
    return {"engine": engine, "version": str(getattr(vllm, "__version__", "unknown")),
            "module": path}  # fmt: skip


def vocab_size(model: str) -> int:
    """``vocab_size`` from ``model``/config.json (or its ``text_config``).

    Raises:
        ValueError: ``model`` is not a directory with a config.json naming a vocab size.
    """
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"--model must be a directory with config.json, got {model!r}")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    size = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{path}: no positive vocab_size (got {size!r})")
    return size


def parse_workloads(text: str) -> list[str]:
    """``"1,8,64,nano"`` -> ``["1", "8", "64", "nano"]``.

    Raises:
        ValueError: an entry that is neither ``nano`` nor an integer of at least 1.
    """
    names = [w.strip() for w in text.split(",") if w.strip()]
    for name in names:
        if name != "nano" and not (name.isdigit() and int(name) >= 1):
            raise ValueError(f"--workloads: {name!r} is neither 'nano' nor a batch size >= 1")
    if not names:
        raise ValueError("--workloads is empty")
    return names


def workload_lengths(name: str, args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths) of workload ``name``."""
    if name != "nano":
        b = int(name)
        return [args.input_len] * b, [args.output_len] * b
    rng = random.Random(args.seed)  # as benchmark_throughput.py --dataset random-range
    n, lo, hi = args.num_prompts, args.min_len, args.max_len
    in_lens = [rng.randint(lo, hi) for _ in range(n)]
    return in_lens, [rng.randint(lo, hi) for _ in range(n)]


def token_prompts(lengths: list[int], vocab: int, seed: int) -> list[dict[str, list[int]]]:
    """One ``{"prompt_token_ids": [...]}`` per length, ids uniform in [0, vocab) drawn from
    ``random.Random(seed)`` (the ids benchmark_throughput.py uses for the same seed)."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(n)]} for n in lengths]


def generate(llm: Any, prompts: list, out_lens: list[int], detokenize: bool = True) -> float:
    """Greedy ``ignore_eos`` generation of ``out_lens[i]`` tokens for ``prompts[i]``
    (``detokenize=False`` without a tokenizer); returns the wall seconds (CUDA synchronised
    when present).

    Raises:
        RuntimeError: the engine returned another number of tokens than asked for.
    """
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n, detokenize=detokenize)
        for n in out_lens
    ]
    _sync()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _sync()
    elapsed = time.perf_counter() - t0
    got = sum(len(o.outputs[0].token_ids) for o in outs)
    if got != sum(out_lens):
        raise RuntimeError(f"engine produced {got} tokens, expected {sum(out_lens)}")
    return elapsed


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def workload_label(name: str) -> str:
    """The ``workload`` field of workload ``name``: "nano" or "batch<size>"."""
    return "nano" if name == "nano" else f"batch{name}"


def workload_prompts(
    name: str, lengths: list[int], args: argparse.Namespace, vocab: int, iteration: int | None
) -> list[dict[str, list[int]]]:
    """Workload ``name``'s prompts of ``lengths``: its warm-up (``iteration`` None) or its
    timed run ``iteration`` (0-based); other ids for each, and for each workload."""
    salt = 1000 * (int(name) if name != "nano" else 999)  # different ids per workload
    offset = 500 if iteration is None else 1 + iteration
    return token_prompts(lengths, vocab, args.seed + salt + offset)


def run_workload(llm: Any, name: str, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """Warm up, then time ``args.num_iters`` runs of workload ``name`` (fresh ids each)."""
    in_lens, out_lens = workload_lengths(name, args)
    detok = args.load_format != "dummy"  # dummy runs have no tokenizer (skip_tokenizer_init)
    generate(llm, workload_prompts(name, in_lens, args, vocab, None), out_lens, detok)
    times = []
    for i in range(args.num_iters):
        prompts = workload_prompts(name, in_lens, args, vocab, i)
        times.append(generate(llm, prompts, out_lens, detok))
    elapsed = sum(times) / len(times)
    in_tok, out_tok = sum(in_lens), sum(out_lens)
    return {
        "workload": workload_label(name),
        "num_requests": len(in_lens),
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "num_iters": args.num_iters,
        "detokenize": detok,
        "elapsed_s": round(elapsed, 4),
        "elapsed_s_each": [round(t, 4) for t in times],
        "requests_per_s": round(len(in_lens) / elapsed, 3),
        "output_tokens_per_s": round(out_tok / elapsed, 2),
        "total_tokens_per_s": round((in_tok + out_tok) / elapsed, 2),
    }


def llm_kwargs(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """Keyword arguments for ``LLM(**kw)``: the shared flags plus the engine's own. This
    engine's default step budget is raised to ``--max-model-len`` when that is longer
    (without chunked prefill a whole prompt must fit one step)."""
    kw: dict[str, Any] = {"model": args.model, "dtype": args.dtype, "seed": args.seed,
                          "max_model_len": args.max_model_len,
                          "load_format": args.load_format}  # fmt: skip
    if args.load_format == "dummy":
        kw["skip_tokenizer_init"] = True  # config-only directories have no tokenizer
    if args.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.quantization is not None:
        kw["quantization"] = args.quantization
    if args.device is not None:
        kw["device"] = args.device
    extra = DEFAULT_ENGINE_KWARGS[engine] if args.engine_kwargs is None else args.engine_kwargs
    if args.engine_kwargs is None and "max_num_batched_tokens" in extra:
        budget = max(extra["max_num_batched_tokens"], args.max_model_len)
        extra = {**extra, "max_num_batched_tokens": budget}
    return {**kw, **extra}


def conditions(info: dict[str, str], kw: dict[str, Any], startup_s: float) -> dict[str, Any]:
    """The run's conditions: engine, versions, device and the LLM keyword arguments."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        **info,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "python": platform.python_version(),
        "llm_kwargs": kw,
        "startup_s": round(startup_s, 2),
    }


def start_engine(args: argparse.Namespace, info: dict[str, str], title: str) -> tuple[Any, dict]:
    """``LLM(**llm_kwargs(...))`` of the imported engine (``info``: :func:`detect_engine`),
    timed; prints the run's conditions under ``title`` and returns (llm, conditions)."""
    from vllm import LLM

    kw = llm_kwargs(args, info["engine"])
    t0 = time.perf_counter()
    llm = LLM(**kw)
    cond = conditions(info, kw, time.perf_counter() - t0)
    print(f"==== {title} conditions ====")
    for k, v in cond.items():
        print(f"  {k:<10} : {v}")
    print(flush=True)
    return llm, cond


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``{"bench": "vs_upstream_ratio", model, workload, upstream and fork tokens/s,
    ratio}`` per (model, workload) that both engines ran (the last line of each wins);
    ratio = fork / upstream output tokens/s, rounded to 3 places."""
    best: dict[tuple[str, str], dict[str, dict]] = {}
    for r in records:
        best.setdefault((r["model"], r["workload"]), {})[r["engine"]] = r
    out = []
    for (model, workload), by_engine in best.items():
        if set(by_engine) != {"fork", "upstream"}:
            continue
        up, fork = by_engine["upstream"], by_engine["fork"]
        out.append({
            "bench": "vs_upstream_ratio", "model": model, "workload": workload,
            "upstream_version": up["version"], "fork_version": fork["version"],
            "upstream_output_tokens_per_s": up["output_tokens_per_s"],
            "fork_output_tokens_per_s": fork["output_tokens_per_s"],
            "ratio": round(fork["output_tokens_per_s"] / up["output_tokens_per_s"], 3),
            "upstream_startup_s": up["startup_s"], "fork_startup_s": fork["startup_s"],
            "fork_llm_kwargs": fork["llm_kwargs"], "upstream_llm_kwargs": up["llm_kwargs"],
        })  # fmt: skip
    return out


def make_parser() -> argparse.ArgumentParser:
    """The flags (see the module docstring)."""
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF directory (or config-only, with dummy).")
    p.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument(
        "--quantization",
        default=None,
        choices=("fp8",),
        help="Both engines quantize the weights on load (fp8: online fp8).",
    )
    p.add_argument("--device", default=None, help="Only when given (this engine: cpu).")
    p.add_argument("--workloads", default="1,8,64,nano", help="Batch sizes and/or 'nano'.")
    p.add_argument("--input-len", type=int, default=128, help="Batch workloads: prompt tokens.")
    p.add_argument("--output-len", type=int, default=128, help="Batch workloads: new tokens.")
    p.add_argument("--num-prompts", type=int, default=256, help="nano: requests.")
    p.add_argument("--min-len", type=int, default=100, help="nano: lower length bound.")
    p.add_argument("--max-len", type=int, default=1024, help="nano: upper length bound.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-iters", type=int, default=1, help="Timed runs per workload.")
    p.add_argument("--engine-kwargs", type=json.loads, default=None,
                   help="JSON object replacing the engine's own flags "
                   f"(default: {DEFAULT_ENGINE_KWARGS}).")  # fmt: skip
    p.add_argument("--expect-engine", choices=("fork", "upstream"), default=None)
    p.add_argument("--output-json", default=None, help="Append the JSON lines here.")
    p.add_argument(
        "--summarize", default=None, metavar="JSONL",
        help="Instead of running: fork / upstream ratios of a results file.",
    )  # fmt: skip
    return p


def check_args(args: argparse.Namespace) -> None:
    """Raises ValueError naming the first bad value."""
    for name in ("input_len", "output_len", "num_prompts", "num_iters", "max_model_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.min_len <= args.max_len:
        raise ValueError(f"nano lengths need 1 <= --min-len <= --max-len, got "
                         f"[{args.min_len}, {args.max_len}]")  # fmt: skip
    if args.engine_kwargs is not None and not isinstance(args.engine_kwargs, dict):
        raise ValueError(f"--engine-kwargs must be a JSON object, got {args.engine_kwargs!r}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``argv`` (default: sys.argv), run every workload on one engine, print the
    conditions and one JSON line per workload; returns the records.

    Raises:
        RuntimeError: ``--expect-engine`` names the other engine than the one imported.
    """
    args = make_parser().parse_args(argv)
    if args.summarize:
        with open(args.summarize, encoding="utf-8") as fh:
            lines = [json.loads(x) for x in fh if x.startswith("{")]
        ratios = summarize([r for r in lines if r.get("bench") == "vs_upstream"])
        for rec in ratios:
            print(json.dumps(rec), flush=True)
        return ratios
    with setup_checks():  # a bad flag value or model: one error line from the script
        if not args.model:
            raise ValueError("--model is required (unless --summarize)")
        workloads = parse_workloads(args.workloads)
        check_args(args)
        longest = max(args.input_len + args.output_len,
                      2 * args.max_len if "nano" in workloads else 0)  # fmt: skip
        if longest > args.max_model_len:
            raise ValueError(f"--max-model-len {args.max_model_len} is below the longest "
                             f"request ({longest} tokens)")  # fmt: skip
        vocab = vocab_size(args.model)
    info = detect_engine()
    if args.expect_engine and info["engine"] != args.expect_engine:
        raise RuntimeError(f"--expect-engine {args.expect_engine}, but imported {info}")
    llm, cond = start_engine(args, info, "benchmark_vs_upstream")
    records = []
    for name in workloads:
        rec = {"bench": "vs_upstream", **cond, "model": args.model,
               "load_format": args.load_format, "dtype": args.dtype,
               **run_workload(llm, name, args, vocab)}  # fmt: skip
        line = json.dumps(rec)
        print(line, flush=True)
        if args.output_json:
            with open(args.output_json, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        records.append(rec)
    return records


if __name__ == "__main__":
    run_script(main)
