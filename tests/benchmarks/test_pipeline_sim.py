"""The pipeline simulator (benchmarks/benchmark_pipeline_sim.py) runs a short configuration
on CPU and reports every key with self-consistent counts (never speed)."""

import importlib
import os
import sys

import pytest

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _sim_module():
    path = os.path.abspath(BENCH_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("benchmark_pipeline_sim")


@pytest.mark.forked
def test_pipeline_sim_short_run_reports_keys(monkeypatch):
    """PP = 2, 4 requests x 6 tokens, two passes per call: per VE (2 requests each) one
    prefill call plus decode calls of 2, 2 and 1 passes (the mp executor on gloo)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    sim = _sim_module()
    argv = ["--pp", "2", "--num-scheduler-steps", "2", "--num-requests", "4",
            "--output-len", "6", "--step-ms", "1", "--layers", "2", "--hidden", "64",
            "--vocab", "256"]  # fmt: skip
    (rec,) = sim.main(argv)
    for steps, calls in ((2, 8),):
        assert rec["bench"] == "pipeline_sim"
        assert (rec["pp"], rec["virtual_engines"], rec["executor"]) == (2, 2, "mp")
        assert rec["num_scheduler_steps"] == steps
        assert rec["steps"] == calls
        assert rec["passes"] == 12  # stage 0's forwards: 2 VEs x (1 prefill + 5 decode)
        assert rec["tokens_per_s"] == pytest.approx(24 / rec["wall_s"], rel=0.01)
        assert len(rec["stage_busy"]) == 2
        assert all(0.0 < b <= 1.0 for b in rec["stage_busy"]), rec["stage_busy"]
        assert set(rec["host_ms_per_step"]) == set(sim.HOST_KEYS)
        assert all(v >= 0 for v in rec["host_ms_per_step"].values())
        assert rec["stage_ms_per_step"][1]["sample"] > 0  # the last stage samples
        assert rec["stage_ms_per_step"][0]["sample"] == 0
