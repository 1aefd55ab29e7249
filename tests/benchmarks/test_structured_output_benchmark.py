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
