"""Plot output tokens/s against batch size from ``benchmark_throughput.py --batch-sizes``.

Reads the ``{"bench": "throughput_sweep", ...}`` JSON lines of one or more files (other
lines, such as progress output captured with the JSON, are skipped) and draws one line per
runner: the engine with CUDA graphs, the engine with ``--enforce-eager`` and transformers
``generate()``, on log-log axes. Usage::

    python benchmarks/benchmark_throughput.py --batch-sizes 1,8,64 --hf-peer \\
        --output-json sweep.jsonl
    python benchmarks/plot_throughput.py sweep.jsonl            # -> docs/throughput_vs_batch.png
"""

from __future__ import annotations

import importlib.util
import json
import math
import os

from vllm.utils import FlexibleArgumentParser

SERIES = (
    ("graphs_output_tokens_per_s", "engine, CUDA graphs", "o-"),
    ("eager_output_tokens_per_s", "engine, --enforce-eager", "s--"),
    ("hf_output_tokens_per_s", "transformers generate()", "^:"),
)
DEFAULT_OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "docs", "throughput_vs_batch.png"
)


def read_sweep(paths: list[str]) -> list[dict]:
    """The throughput_sweep records of ``paths``, sorted by batch size (a later record for
    the same batch size replaces an earlier one).

    Raises:
        ValueError: no throughput_sweep line in any of the files.
    """
    by_bs: dict[int, dict] = {}
    for path in paths:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("bench") == "throughput_sweep":
                    by_bs[int(rec["batch_size"])] = rec
    if not by_bs:
        raise ValueError(f"no 'throughput_sweep' JSON lines in {paths}.")
    return [by_bs[b] for b in sorted(by_bs)]


def plot(records: list[dict], out: str) -> str:
    """Write the tokens/s vs batch-size figure to ``out`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in SERIES:
        pts = [(r["batch_size"], r[key]) for r in records if r.get(key)]
        if pts:
            xs, ys = zip(*pts)
            if key.startswith("graphs") and not any(r.get("graphs_cuda_graphs") for r in records):
                label = "engine, graphs requested (none captured: not CUDA)"
            ax.plot(xs, ys, style, label=label)
    first = records[0]
    title = f"{os.path.basename(str(first.get('model', '')))} on {first.get('gpu', '?')}"
    if "input_len" in first:
        title += f", {first['input_len']} in / {first['output_len']} out"
    ax.set_title(title + f", {first.get('dtype', '')}", fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    # label only the 2x and 5x minor ticks, so long decades do not overlap
    ax.yaxis.set_minor_formatter(
        matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""
        )
    )
    ax.set_xlabel("batch size (requests decoded together)")
    ax.set_ylabel("output tokens/s")
    ax.set_xticks([r["batch_size"] for r in records], [str(r["batch_size"]) for r in records])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> str:
    p = FlexibleArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="Files with the sweep's JSON lines.")
    p.add_argument("--out", default=DEFAULT_OUT, help="PNG to write.")
    args = p.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        p.error("plotting needs matplotlib: pip install matplotlib (or -r requirements-test.txt)")
    path = plot(read_sweep(args.inputs), args.out)
    print(f"wrote {os.path.normpath(path)}")
    return path


if __name__ == "__main__":
    main()
