"""benchmark_structured_output.py runs end to end on CPU: one JSON line per batch size and
mode, the ratio computed from the same run's two throughputs."""

import importlib
import json
import os

import pytest

BENCH_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


@pytest.mark.forked
def test_structured_output_benchmark_lines(tiny_llama_dir, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.syspath_prepend(BENCH_DIR)
    bench = importlib.import_module("benchmark_structured_output")
    argv = ["--model", tiny_llama_dir, "--device", "cpu", "--batch-sizes", "1,2",
            "--output-len", "6", "--min-items", "1", "--max-model-len", "128"]  # fmt: skip
    records = bench.main(argv)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert lines == [json.loads(json.dumps(r)) for r in records]
    assert [(r["batch_size"], r["mode"]) for r in records] == [
        (1, "unconstrained"),
        (1, "json_schema"),
        (2, "unconstrained"),
        (2, "json_schema"),
    ]
    for plain, constrained in (records[0:2], records[2:4]):
        assert plain["output_tokens"] == 6 * plain["batch_size"]  # EOS ignored
        assert 0 < constrained["output_tokens"] <= 6 * constrained["batch_size"]
        expected = constrained["output_tokens_per_s"] / plain["output_tokens_per_s"]
        assert abs(constrained["ratio_vs_unconstrained"] - expected) < 0.01
        assert constrained["outputs_parsing"] == 0  # 6 tokens cannot close a record


def test_structured_output_benchmark_refuses_bad_flags_in_one_line(monkeypatch):
    """Unparsable or non-positive --batch-sizes, --output-len 0, a negative --min-items and
    an engine the flags cannot build (--device cuda without CUDA) are one `error:` line and
    exit status 2 (they were tracebacks)."""
    import subprocess
    import sys

    import torch

    monkeypatch.syspath_prepend(BENCH_DIR)
    bench = importlib.import_module("benchmark_structured_output")
    common = importlib.import_module("bench_common")
    cases = [
        (["--batch-sizes", "1,x"], "--batch-sizes must be comma-separated integers, got '1,x'"),
        (["--batch-sizes", "4,0"], "--batch-sizes must all be at least 1, got '4,0'"),
        (["--output-len", "0"], "--output-len must be at least 1, got 0"),
        (["--min-items", "-1"], "--min-items must be >= 0, got -1"),
    ]
    for argv, message in cases:
        with pytest.raises(common.UsageError, match=message):
            bench.main(argv)
    if not torch.cuda.is_available():
        script = os.path.join(BENCH_DIR, "benchmark_structured_output.py")
        proc = subprocess.run([sys.executable, script, "--device", "cuda"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1] == (
            "error: device='cuda' was requested but torch.cuda.is_available() is False."
        )
