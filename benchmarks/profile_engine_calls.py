"""Where a workload's wall time goes in this engine: prefill calls, decode calls by width,
and the host between calls.

Runs the workloads of ``benchmark_vs_upstream.py`` (same flags, same requests, this
engine's recommended flags unless ``--engine-kwargs`` replaces them) with every model
call (``executor.execute_model``) timed on the host. A call's wall time holds its input
preparation, its device work and the read of its sampled tokens; with async output
processing the previous step's texts and outputs are made inside it too. What lies
between two calls is the engine's host work that the device waits for: appending tokens,
stop checks, scheduling. Prints the conditions, then per timed iteration one JSON line::

    {"bench": "engine_calls", "workload", "elapsed_s", "output_tokens_per_s",
     "prefill": {"calls", "s", "tokens", "max_ms"},
     "decode": {"calls", "s", "tokens", "rows_per_call"},
     "between_calls_s", "before_first_decode_s",
     "decode_by_rows": {"<bucket>": [calls, ms per call, tokens]}, ...conditions}

``decode_by_rows`` groups the decode calls by their rows, rounded up to a multiple of
``--bucket`` (32): the mean wall per call against the width shows the per-call cost that
does not scale with rows. ``tokens`` counts the sampled tokens the calls returned (a
multi-step call returns several per row; prefill: the prompt tokens computed).

Example (H200)::

    python benchmarks/profile_engine_calls.py --model benchmarks/configs/qwen2.5-0.5b \\
        --load-format dummy --workloads nano --num-iters 2
"""

from __future__ import annotations

import json
import time
from typing import Any

import benchmark_vs_upstream as vs


def _sampled_tokens(output: Any) -> int:
    """Sampled tokens in a call's result (a SamplerOutput or a list of them; None)."""
    if output is None:
        return 0
    total = 0
    for step in output if isinstance(output, list) else [output]:
        for group in step.outputs:
            if group is not None:
                total += sum(len(s.token_ids) for s in group.samples)
    return total


def _prompt_tokens(metadata: list) -> int:
    """Prompt tokens a prefill call computes: each sequence's chunk, or its whole prompt
    past the cached part."""
    total = 0
    for md in metadata:
        for seq_id, data in md.seq_data.items():
            cached = (md.computed_lens or {}).get(seq_id, 0)
            total += md.token_chunk_size or data.get_prompt_len() - cached
    return total


class CallTimer:
    """Wraps an executor's ``execute_model``; ``calls`` collects one tuple per call:
    (kind "prefill" | "decode", rows, tokens, start s, end s) from ``time.perf_counter``."""

    def __init__(self, executor: Any):
        self.calls: list[tuple[str, int, int, float, float]] = []
        self._execute = executor.execute_model
        executor.execute_model = self._timed

    def _timed(self, request: Any) -> Any:
        t0 = time.perf_counter()
        out = self._execute(request)
        t1 = time.perf_counter()
        md = request.seq_group_metadata_list
        if md and md[0].is_prompt:
            self.calls.append(("prefill", len(md), _prompt_tokens(md), t0, t1))
        else:
            self.calls.append(("decode", len(md), _sampled_tokens(out), t0, t1))
        return out


def summarize(calls: list[tuple[str, int, int, float, float]], bucket: int) -> dict[str, Any]:
    """The JSON fields of one iteration's calls (see the module doc)."""
    pre = [c for c in calls if c[0] == "prefill"]
    dec = [c for c in calls if c[0] == "decode"]
    by_rows: dict[int, list[float]] = {}
    for _, rows, tokens, t0, t1 in dec:
        b = -(-rows // bucket) * bucket
        acc = by_rows.setdefault(b, [0, 0.0, 0])
        acc[0] += 1
        acc[1] += t1 - t0
        acc[2] += tokens
    return {
        "prefill": {
            "calls": len(pre),
            "s": round(sum(c[4] - c[3] for c in pre), 4),
            "tokens": sum(c[2] for c in pre),
            "max_ms": round(max((c[4] - c[3] for c in pre), default=0.0) * 1e3, 2),
        },
        "decode": {
            "calls": len(dec),
            "s": round(sum(c[4] - c[3] for c in dec), 4),
            "tokens": sum(c[2] for c in dec),
            "rows_per_call": round(sum(c[1] for c in dec) / max(1, len(dec)), 1),
        },
        "between_calls_s": round(sum(b[3] - a[4] for a, b in zip(calls, calls[1:])), 4),
        "before_first_decode_s": round(dec[0][3] - calls[0][3], 4) if dec else None,
        "decode_by_rows": {
            str(b): [int(n), round(s * 1e3 / n, 2), int(t)]
            for b, (n, s, t) in sorted(by_rows.items())
        },
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``argv`` (benchmark_vs_upstream.py's flags plus ``--bucket``), run each
    workload's warm-up and ``--num-iters`` timed iterations; returns the JSON records.

    Raises:
        ValueError: a bad flag value (as benchmark_vs_upstream.py), or ``--bucket`` < 1.
    """
    p = vs.make_parser()
    p.add_argument("--bucket", type=int, default=32, help="Decode rows per width bucket.")
    args = p.parse_args(argv)
    if not args.model:
        raise ValueError("--model is required")
    if args.bucket < 1:
        raise ValueError(f"--bucket must be >= 1, got {args.bucket}")
    vs.check_args(args)
    workloads = vs.parse_workloads(args.workloads)
    info = vs.detect_engine()
    if info["engine"] != "fork":
        raise RuntimeError(f"profile_engine_calls.py times this engine's calls; imported {info}")
    llm, cond = vs.start_engine(args, info, "profile_engine_calls")
    timer = CallTimer(llm.llm_engine.executor)
    vocab = vs.vocab_size(args.model)
    detok = args.load_format != "dummy"
    records = []
    for name in workloads:
        in_lens, out_lens = vs.workload_lengths(name, args)
        vs.generate(llm, vs.workload_prompts(name, in_lens, args, vocab, None), out_lens, detok)
        for i in range(args.num_iters):
            timer.calls.clear()
            prompts = vs.workload_prompts(name, in_lens, args, vocab, i)
            elapsed = vs.generate(llm, prompts, out_lens, detok)
            rec = {
                "bench": "engine_calls",
                **cond,
                "workload": vs.workload_label(name),
                "elapsed_s": round(elapsed, 4),
                "output_tokens_per_s": round(sum(out_lens) / elapsed, 2),
                **summarize(timer.calls, args.bucket),
            }
            print(json.dumps(rec), flush=True)
            records.append(rec)
    return records


if __name__ == "__main__":
    main()
