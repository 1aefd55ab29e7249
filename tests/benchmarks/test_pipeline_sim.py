"""The pipeline simulator (benchmarks/benchmark_pipeline_sim.py) runs a short configuration
on CPU and reports every key with self-consistent counts (never speed)."""

import importlib
import os
import sys

import pytest

from tests.utils import stage_start_method

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _sim_module():
    path = os.path.abspath(BENCH_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("benchmark_pipeline_sim")


def _within_rounding(value: float, numerator: float, wall_s: float, digits: int) -> bool:
    """Whether ``value`` can be ``round(numerator / wall, digits)`` for a wall that rounds
    to ``wall_s`` (3 digits): the record rounds both, so their ratio is only known to
    within the two roundings, whatever the wall (the machine's speed) was."""
    half = 0.5 * 10.0**-digits
    lo = numerator / (wall_s + 5e-4) - half
    hi = numerator / (wall_s - 5e-4) + half
    return lo - 1e-9 <= value <= hi + 1e-9


@pytest.mark.forked
def test_pipeline_sim_short_run_reports_keys(monkeypatch):
    """PP = 2, 4 requests x 6 tokens, two passes per call: per VE (2 requests each) one
    prefill call plus decode calls of 2, 2 and 1 passes (the mp executor on gloo). Counts
    and device seconds are exact; anything divided by the wall is only checked against
    them within the record's rounding, and is in range for any wall. The async engine's
    record has the same keys but the host split."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    sim = _sim_module()
    argv = ["--pp", "2", "--num-scheduler-steps", "2", "--num-requests", "4",
            "--output-len", "6", "--step-ms", "1", "--layers", "2", "--hidden", "64",
            "--vocab", "256"]  # fmt: skip
    (rec,) = sim.main(argv)
    assert rec["bench"] == "pipeline_sim"
    assert (rec["pp"], rec["virtual_engines"], rec["executor"]) == (2, 2, "mp")
    assert rec["num_scheduler_steps"] == 2
    assert rec["steps"] == 8  # 2 VEs x (1 prefill + 3 decode calls)
    assert rec["passes"] == 12  # stage 0's forwards: 2 VEs x (1 prefill + 5 decode)
    # the last stage reads every call's last pass, after the 12 passes of 0.5 ms before it
    assert rec["wall_s"] >= 0.006
    assert _within_rounding(rec["tokens_per_s"], 24, rec["wall_s"], 1), rec
    # device seconds are exact: 12 passes of 1 ms / 2 stages on each stage
    assert rec["stage_device_s"] == pytest.approx([0.006, 0.006], abs=1e-6)
    assert len(rec["stage_busy"]) == 2
    for busy in rec["stage_busy"]:
        assert 0.0 <= busy <= 1.0, rec["stage_busy"]
        assert _within_rounding(busy, 0.006, rec["wall_s"], 3), rec
    assert set(rec["host_ms_per_step"]) == set(sim.HOST_KEYS)
    assert all(v >= 0 for v in rec["host_ms_per_step"].values())
    assert rec["stage_ms_per_step"][1]["sample"] > 0  # the last stage samples
    assert rec["stage_ms_per_step"][0]["sample"] == 0
    # only the last stage waits for its device (to read logits); the others launch
    assert rec["stage_ms_per_step"][0]["device_wait"] == 0
    assert rec["stage_ms_per_step"][1]["device_wait"] >= 0
    assert len(rec["cpu_cores_used"]) == 3  # the engine and two stage processes
    assert all(c >= 0 for c in rec["cpu_cores_used"])
    assert rec["calls_at_once"] in (1, 2)  # the mp executor's stages stream calls
    (rec,) = sim.main([*argv, "--engine", "async"])  # vllm serve's engine
    assert (rec["engine"], rec["pp"], rec["executor"]) == ("async", 2, "mp")
    # how requests group into calls depends on when the loop admits them: counts vary
    assert rec["passes"] >= 12 and rec["calls_at_once"] in (1, 2)
    assert _within_rounding(rec["tokens_per_s"], 24, rec["wall_s"], 1), rec
    assert len(rec["stage_busy"]) == 2 and all(0.0 <= b <= 1.0 for b in rec["stage_busy"])


def test_sim_timing_and_its_errors(tiny_llama_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.sim_model import SimTiming

    t = SimTiming.from_extra_config({"step_ms": 8, "per_row_us": 10, "per_token_us": 1})
    # (8000 us + 10 us x 4 rows + 1 us x 6 tokens) / 2 stages
    assert t.stage_seconds(4, 6, 2) == pytest.approx(4023e-6)
    assert SimTiming.from_extra_config(None).stage_seconds(1, 1, 4) == pytest.approx(2e-3)
    with pytest.raises(ValueError, match=r"\['step_s'\] are not known"):
        SimTiming.from_extra_config({"step_s": 1})
    with pytest.raises(ValueError, match="must be >= 0"):
        SimTiming.from_extra_config({"step_ms": -1})
    args = dict(model=tiny_llama_dir, device="cpu", load_format="sim")
    cfg = EngineArgs(**args, model_loader_extra_config='{"step_ms": 2}').create_engine_config()
    assert cfg.model_config.model_loader_extra_config == {"step_ms": 2}
    with pytest.raises(ValueError, match="not valid JSON"):
        EngineArgs(**args, model_loader_extra_config="{step_ms").create_engine_config()
    with pytest.raises(ValueError, match="must be a JSON object"):
        EngineArgs(**args, model_loader_extra_config="[1]").create_engine_config()


def test_sim_device_queues_in_order_and_waits_for_inputs():
    """The asynchronous stand-in device: launches return at once and queue in order, a
    forward starts no earlier than its inputs' ready time, and a wait for an earlier
    forward does not wait for later ones (large times, never waited for: no timing)."""
    import time

    import torch

    from vllm.model_executor.model_loader.sim_model import (
        SimDevice,
        read_ready_stamp,
        write_ready_stamp,
    )

    dev = SimDevice()
    t = time.monotonic()
    first = dev.launch(100.0)
    assert t + 100.0 <= first <= time.monotonic() + 100.0
    assert dev.launch(50.0) == pytest.approx(first + 50.0)  # queued behind the first
    later = time.monotonic() + 1000.0
    assert dev.launch(1.0, not_before=later) == pytest.approx(later + 1.0)
    assert dev.busy_s == pytest.approx(151.0)
    dev.synchronize(until=t - 1.0)  # finished long ago: returns at once
    assert dev.wait_s == 0.0
    dev.reset()
    assert (dev.busy_s, dev.wait_s) == (0.0, 0.0)
    hidden = torch.zeros(3, 4)
    write_ready_stamp(hidden, 1234.5678)
    assert read_ready_stamp(hidden.clone()) == 1234.5678
    assert hidden.view(-1)[2:].abs().sum() == 0  # only the first 8 bytes hold it


def _sim_stage(pp_rank: int, table_dir: str, step_ms: float):
    """Stage ``pp_rank`` of 2 of a tiny stand-in model sharing the ids table in ``table_dir``."""
    import torch
    from transformers import LlamaConfig

    from vllm.model_executor.model_loader.sim_model import SimStageModel, SimTiming

    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=32)  # fmt: skip
    return SimStageModel(cfg, pp_rank, 2, SimTiming(step_ms=step_ms), torch.float32, table_dir)


def test_sim_deferred_read_publishes_ids_time_and_stage0_waits_for_it(tmp_path):
    """A pass whose ids the host reads later (a multi-step call's passes before its last)
    does not wait for the stand-in device; its ready time reaches stage 0 through the
    shared table, per virtual engine, and stage 0's next forward of that virtual engine
    starts no earlier. A read that is not deferred waits (2 s of simulated device time)."""
    import time

    import torch

    from vllm.forward_context import deferred_host_read, set_forward_context
    from vllm.model_executor.model_loader.sim_model import ReadyTable, read_ready_stamp
    from vllm.sequence import IntermediateTensors

    a, b = ReadyTable(str(tmp_path)), ReadyTable(str(tmp_path))
    a.publish(3, 123.5)
    assert (b.ready_at(3), b.ready_at(0)) == (123.5, 0.0)  # one table, zeros where unset
    missing = str(tmp_path / "not-a-dir")  # not writable: a file in the temp dir instead
    ReadyTable(missing).publish(1, 7.0)
    assert ReadyTable(missing).ready_at(1) == 7.0

    last = _sim_stage(1, str(tmp_path), step_ms=4000.0)  # 2 s a pass on each of 2 stages
    inter = IntermediateTensors(
        {"hidden_states": torch.zeros(2, 16), "residual": torch.zeros(2, 16)}
    )
    ids, pos = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    with set_forward_context(5):
        hidden = last(ids, pos, None, None, inter)  # launched: ready in 2 s
    t0 = time.monotonic()
    with deferred_host_read():
        logits = last.compute_logits(hidden)
    assert logits.shape == (2, 32)
    assert last.device_clock.wait_s == 0.0  # returned at once
    assert a.ready_at(5) == hidden.sim_ready_at > t0 + 1.0  # published for VE 5
    last.compute_logits(hidden)  # a read: waits for the forward
    assert last.device_clock.wait_s > 0.5 and time.monotonic() >= hidden.sim_ready_at

    later = time.monotonic() + 1000.0
    a.publish(5, later)  # VE 5's ids are ready only then
    first = _sim_stage(0, str(tmp_path), step_ms=2.0)  # 1 ms a pass
    with set_forward_context(5):
        out = first(ids, pos, None, None)
    assert read_ready_stamp(out["hidden_states"]) == pytest.approx(later + 1e-3)
    other = _sim_stage(0, str(tmp_path), step_ms=2.0)  # a fresh device, VE 4's ids
    with set_forward_context(4):
        out = other(ids, pos, None, None)
    assert read_ready_stamp(out["hidden_states"]) < later - 900.0  # not held back
