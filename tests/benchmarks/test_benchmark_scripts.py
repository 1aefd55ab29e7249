"""The benchmark scripts run end to end on CPU and report sane, self-consistent numbers."""

import importlib
import json
import os
import sys

import pytest

from tests.utils import fork_vllm_commands

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _bench_module(name: str):
    """Import a benchmarks/ script as a module (they import their helpers by bare name)."""
    path = os.path.abspath(BENCH_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


@pytest.mark.forked
def test_latency_main_reports_positive_physics(tiny_llama_dir, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    lat = _bench_module("benchmark_latency")
    physics = _bench_module("bench_physics")
    argv = [
        "--model",
        tiny_llama_dir,
        "--device",
        "cpu",
        "--max-model-len",
        "64",
        "--input-len",
        "6",
        "--output-len",
        "5",
        "--batch-size",
        "3",
        "--num-iters-warmup",
        "1",
        "--num-iters",
        "2",
        "--no-tqdm",
        "--peak-bandwidth",
        "2e11",
    ]
    record = lat.main(argv)

    out = capsys.readouterr().out
    assert out.index("benchmark_latency conditions") < out.index('{"bench"')
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"bench"')]
    assert lines == [json.loads(json.dumps(record))]
    assert record["bench"] == "latency"
    assert (record["batch_size"], record["input_len"], record["output_len"]) == (3, 6, 5)
    assert record["gpu"] == "cpu" and record["cuda_graphs"] is False
    assert record["attn_backend"] == "TORCH_SDPA" and record["dtype"] == "float32"
    for key in (
        "avg_latency_s",
        "p50_latency_s",
        "p90_latency_s",
        "prefill_latency_s",
        "output_tokens_per_s",
        "time_per_output_token_s",
        "achieved_bandwidth_gb_s",
    ):
        assert record[key] > 0, key
    assert record["p50_latency_s"] <= record["p90_latency_s"]
    assert record["peak_bandwidth_gb_s"] == 200.0  # as given
    # Without --peak-bandwidth no peak is assumed off an H200 (no floor ratio then).
    assert lat.peak_bandwidth(None, "cpu") is None and lat.peak_bandwidth(1e9, "cpu") == 1e9
    # 2 timed runs x 4 decode steps each, all eager on CPU, plus one prefill step per run.
    assert record["decode_steps"] == {"eager_enforce_eager": 8, "eager_prefill": 2}

    # Bytes per step: the model's parameters agree with the config-only count; KV term exact.
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_llama_dir)
    assert record["weight_bytes_per_step"] == physics.config_weight_bytes(cfg, 4, 3)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4 * (6 + 5 / 2) * 3
    assert record["kv_bytes_per_step"] == int(kv)
    bw = record["bytes_per_decode_step"] / record["time_per_output_token_s"] / 1e9
    assert record["achieved_bandwidth_gb_s"] == pytest.approx(bw)
    assert record["bandwidth_floor_ratio"] == pytest.approx(bw / 200.0)


def test_config_weight_bytes_of_real_shapes():
    physics = _bench_module("bench_physics")
    from transformers import AutoConfig

    qwen = AutoConfig.from_pretrained(os.path.join(BENCH_DIR, "configs", "qwen2.5-0.5b"))
    # Qwen2.5-0.5B has 494,032,768 parameters (tied); + one embedding row for batch 1.
    assert physics.config_weight_bytes(qwen, 2, 1) == 2 * (494_032_768 + 896)
    llama = AutoConfig.from_pretrained(os.path.join(BENCH_DIR, "configs", "llama-3.1-8b"))
    # Llama-3.1-8B: 8,030,261,248 parameters, of which the 525,336,576-entry embedding table
    # is only gathered (one row of 4096 at batch 1).
    assert physics.config_weight_bytes(llama, 2, 1) == 2 * (8_030_261_248 - 525_336_576 + 4096)


def test_counter_delta_and_plot(tmp_path):
    common = _bench_module("bench_common")
    before = {"graph": {0: {8: 2}}, "eager": {0: {"prefill": 1}}}
    after = {"graph": {0: {8: 5, 1: 1}}, "eager": {0: {"prefill": 3, "too_big": 2}}}
    assert common.counter_delta(before, after) == {
        "eager_prefill": 2,
        "eager_too_big": 2,
        "graph": 4,
    }
    assert common.counter_delta({}, {0: after, 1: after})["graph"] == 12  # mp: per rank

    pytest.importorskip("matplotlib")
    plot = _bench_module("plot_throughput")
    data = tmp_path / "sweep.jsonl"
    rows = [
        {
            "bench": "throughput_sweep",
            "batch_size": b,
            "graphs_output_tokens_per_s": 10.0 * b,
            "eager_output_tokens_per_s": 5.0 * b,
            "hf_output_tokens_per_s": 2.0 * b,
            "graphs_cuda_graphs": True,
            "model": "m",
            "gpu": "g",
        }
        for b in (4, 1)
    ]
    data.write_text("progress bar noise\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r["batch_size"] for r in plot.read_sweep([str(data)])] == [1, 4]
    out = plot.main([str(data), "--out", str(tmp_path / "p.png")])
    assert os.path.getsize(out) > 1000


@pytest.mark.forked
def test_spec_decode_benchmark_reports_speedup_and_acceptance(smollm2_gguf, monkeypatch):
    """The n-gram setting on the repetitive workload proposes and accepts tokens, and the
    speedup is the ratio of the two settings' tokens/s from the same run."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    spec = _bench_module("benchmark_spec_decode")
    argv = ["--model", smollm2_gguf, "--device", "cpu", "--dtype", "float32",
            "--output-len", "6", "--settings", "none,ngram", "--max-model-len", "256"]  # fmt: skip
    none, ngram = spec.main(argv)
    assert (none["setting"], ngram["setting"]) == ("none", "ngram")
    assert none["speedup"] == 1.0 and none["num_speculative_tokens"] == 0
    assert ngram["num_draft_tokens"] > 0 and 0 < ngram["num_accepted_tokens"]
    assert ngram["num_accepted_tokens"] <= ngram["num_draft_tokens"]
    expected = ngram["output_tokens_per_s"] / none["output_tokens_per_s"]
    assert abs(ngram["speedup"] - expected) < 0.01


@pytest.mark.forked
def test_spec_decode_benchmark_refuses_bad_flags_in_one_line(smollm2_gguf, monkeypatch):
    """An unknown setting, a count below 1 and a prompt + --output-len beyond
    --max-model-len are one `error:` line and exit status 2 before anything is timed (they
    were tracebacks, and a too-long output was timed and reported as all requested tokens)."""
    import subprocess

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    spec = _bench_module("benchmark_spec_decode")
    common = _bench_module("bench_common")
    base = ["--model", smollm2_gguf, "--device", "cpu", "--dtype", "float32"]
    with pytest.raises(common.UsageError, match="unknown setting 'bogus'; expected none"):
        spec.main([*base, "--settings", "none,bogus"])
    for flag in ("--output-len", "--num-speculative-tokens", "--ngram-prompt-lookup-max"):
        with pytest.raises(common.UsageError, match=f"^{flag} must be at least 1, got 0"):
            spec.main([*base, flag, "0"])
    with pytest.raises(common.UsageError, match="--output-len 100 is more than max_model_len=128"):
        spec.main([*base, "--settings", "none", "--max-model-len", "128", "--output-len", "100"])
    script = os.path.join(BENCH_DIR, "benchmark_spec_decode.py")
    proc = subprocess.run([sys.executable, script, *base, "--settings", "bogus"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown setting 'bogus'")


def test_pipeline_busy_counts_only_the_timed_window():
    """gpu_busy averages the nvidia-smi samples inside the timed runs' window only."""
    import time

    pp = _bench_module("benchmark_pipeline_parallel")
    base = time.mktime(time.strptime("2026/11/29 23:00:00", "%Y/%m/%d %H:%M:%S"))
    lines = [
        "2026/11/29 23:00:00.000, 0, 5",  # start-up: outside the window
        "2026/11/29 23:00:10.500, 0, 90",
        "2026/11/29 23:00:10.500, 1, 70",
        "2026/11/29 23:00:11.000, 0, 80",
        "2026/11/29 23:00:11.000, 1, 50",
        "2026/11/29 23:00:30.000, 1, 0",  # shutdown: outside
        "garbage line",
    ]
    assert pp.parse_util(lines, (base + 10.2, base + 11.5)) == {0: 0.85, 1: 0.6}
    assert pp.parse_util(lines) == {0: round((5 + 90 + 80) / 300, 3), 1: 0.4}


_FAKE_SMI = """#!{python}
import sys, time
# a long start-up's worth of samples first: more than a pipe holds (64 KiB)
sys.stdout.write("2020/01/01 00:00:00.000, 0, 1\\n" * 8000)
sys.stdout.flush()
while True:
    t = time.time()
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t))
    print(f"{{stamp}}.{{int(t % 1 * 1000):03d}}, 0, 75", flush=True)
    time.sleep(0.02)
"""


def test_pipeline_busy_survives_a_long_startup(tmp_path, monkeypatch):
    """Regression: nvidia-smi wrote into a pipe read only at the end; after ~100 s of
    start-up (the Llama-8B shape's FlashInfer JIT) the pipe was full, nvidia-smi blocked,
    and the timed window had no samples (gpu_busy {}). A fake nvidia-smi that writes 240 KB
    before its live samples must still yield the window's busy fraction."""
    import argparse
    import time

    pp = _bench_module("benchmark_pipeline_parallel")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(_FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    def fake_benchmark(cmd, check):  # stands in for the benchmark_throughput process
        time.sleep(1.0)
        start = time.time()
        time.sleep(0.6)
        record = {"output_tokens_per_s": 1.0, "timed_window_epoch_s": [start, time.time()]}
        with open(cmd[cmd.index("--output-json") + 1], "w") as fh:
            fh.write(json.dumps(record) + "\n")

    monkeypatch.setattr(pp.subprocess, "run", fake_benchmark)
    args = argparse.Namespace(
        model="m", load_format="dummy", dtype="bfloat16", max_model_len=64, num_prompts=1,
        input_len=4, output_len=4, gpu_memory_utilization=0.5, sample_ms=20,
    )  # fmt: skip
    rec = pp.run_one(1, args)
    assert rec["gpu_busy"] == {0: 0.75}, rec["gpu_busy"]


@pytest.mark.forked
def test_throughput_sweep_rows(tiny_llama_dir, monkeypatch):
    """--batch-sizes: one row per size with both modes' tokens/s and step counters, and the
    capture figures of the graphs engine (not the eager engine's, which are 0.0)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    tp = _bench_module("benchmark_throughput")
    calls = []

    def fake_conditions(llm):  # the real conditions, capture figures tagged per engine
        cond = real_conditions(llm)
        eager = bool(calls)  # the graphs engine starts first (CPU is eager either way)
        calls.append(eager)
        cond.update(graph_capture_s=0.0 if eager else 1.5, graph_capture_gib=0.0 if eager else 0.25)
        return cond

    real_conditions = tp.engine_conditions
    monkeypatch.setattr(tp, "engine_conditions", fake_conditions)
    argv = ["--model", tiny_llama_dir, "--device", "cpu", "--max-model-len", "64", "--input-len",
            "6", "--output-len", "4", "--batch-sizes", "1,2", "--no-tqdm"]  # fmt: skip
    rows = tp.main(argv)
    assert calls == [False, True]
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["graphs_output_tokens_per_s"] > 0 and r["eager_output_tokens_per_s"] > 0
        assert r["eager_decode_steps"]["eager_enforce_eager"] == 3  # 4 tokens: 1 prefill + 3
        assert (r["graph_capture_s"], r["graph_capture_gib"]) == (1.5, 0.25)


@pytest.mark.forked
def test_prefix_caching_benchmark_reports_hits_only_with_caching(
    tiny_llama_dir, capsys, monkeypatch
):
    """Both parts on CPU at toy sizes: the multi-turn run hits the cache only with caching
    on (turns 2+ share the system prompt and history), the random offline run never hits."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    bench = _bench_module("benchmark_prefix_caching")
    fork_vllm_commands(bench, monkeypatch)  # its two `vllm serve` runs
    argv = ["--model", tiny_llama_dir, "--device", "cpu", "--block-size", "4",
            "--max-model-len", "128", "--vocab", "400", "--conversations", "2", "--turns", "2",
            "--system-len", "16", "--user-len", "4", "--reply-len", "4", "--output-len", "3",
            "--num-prompts", "4", "--min-input-len", "8", "--max-input-len", "16",
            "--min-output-len", "2", "--max-output-len", "4"]  # fmt: skip
    serving, offline = bench.main(argv)
    lines = [
        json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"bench"')
    ]
    assert lines == [serving, offline]
    assert serving["off_hit_rate"] == 0.0
    # Turn 2's prompts (28 tokens) find turn 1's blocks; no run finds everything.
    assert 0.0 < serving["on_hit_rate"] < 1.0
    for tag in ("off", "on"):
        for key in ("turn1_ttft_p50_ms", "turn2plus_ttft_p99_ms"):
            assert serving[f"{tag}_{key}"] > 0
    assert serving["turn2plus_ttft_p50_off_over_on"] > 0
    assert offline["off_hit_tokens"] == offline["on_hit_tokens"] == 0
    assert offline["on_over_off"] > 0


@pytest.mark.forked
def test_chunked_prefill_benchmark_reports_both_runs(tiny_llama_dir, capsys, monkeypatch):
    """The serving run on CPU at toy sizes (two streams, two 40-token prompts, a 16-token
    chunked budget): one JSON line with TPOT and TTFT percentiles of both runs (values
    depend on machine speed; only their presence and sign are checked). The streams may
    generate 507 tokens, so on a fast machine they still run when the long prompts come;
    on a slow one they share the long requests' decode steps."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    bench = _bench_module("benchmark_chunked_prefill")
    fork_vllm_commands(_bench_module("benchmark_prefix_caching"), monkeypatch)  # its Server
    argv = ["--model", tiny_llama_dir, "--device", "cpu", "--block-size", "4",
            "--max-model-len", "512", "--vocab", "400", "--streams", "2",
            "--stream-prompt-len", "4", "--warmup-s", "0.2", "--num-long", "2",
            "--long-len", "40", "--long-output-len", "4", "--long-rate", "4",
            "--chunked-budget", "16", "--server-args", "--max-num-seqs 8",
            "--chunked-server-args", "--piecewise-graph-max-tokens 16"]  # fmt: skip
    rec = bench.main(argv)
    assert rec["chunked_server_args"] == "--piecewise-graph-max-tokens 16"
    lines = [
        json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"bench"')
    ]
    assert lines == [rec]
    for tag in ("off", "on"):
        for key in ("tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
            assert rec[f"{tag}_{key}"] > 0, key
        assert rec[f"{tag}_tpot_samples"] >= 1
    assert rec["tpot_p99_on_over_off"] > 0


def test_chunked_prefill_tpot_samples_split_multi_token_events():
    """An event with k tokens after a gap g is k samples of g / k; only gaps inside the
    window count."""
    bench = _bench_module("benchmark_chunked_prefill")
    times = [(1.0, 1), (1.5, 1), (2.3, 8), (2.4, 1), (9.0, 2)]
    got = bench.tpot_samples(times, start=1.2, end=5.0)
    assert got == pytest.approx([0.1] * 8 + [0.1])
    assert bench.tpot_samples(times, start=0.0, end=10.0) == pytest.approx(
        [0.5] + [0.1] * 8 + [0.1] + [3.3, 3.3]
    )


@pytest.mark.forked
def test_engine_host_profile_counts_calls_and_phases(capsys):
    """16 decode tokens at 8 and 3 steps a call: 2 and 6 timed calls (the prefill is not
    timed); every phase ran, and the total is their sum."""
    prof = _bench_module("profile_engine_host")
    argv = ["--num-scheduler-steps", "8", "3", "--num-requests", "4", "--prompt-len", "5"]
    records = prof.main([*argv, "--output-len", "17"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert lines == records
    assert [r["calls"] for r in records] == [2, 6]
    for r in records:
        assert set(r["ms_per_call"]) == {"schedule", "prepare", "unpack", "apply"}
        assert all(v > 0 for v in r["ms_per_call"].values()), r
        assert abs(r["host_ms_per_call"] - sum(r["ms_per_call"].values())) < 0.01
    with pytest.raises(ValueError, match="--output-len must be at least 2.*got 1"):
        prof.main([*argv, "--output-len", "1"])


def test_serving_benchmark_fails_when_nothing_completes():
    """Against a port where nothing listens every request fails: the RESULT_JSON line is
    valid JSON (nulls, not NaN) naming the error, and the exit status is 1."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the run: connections are refused
    script = os.path.join(BENCH_DIR, "benchmark_serving.py")
    proc = subprocess.run(
        [sys.executable, script, "--base-url", f"http://127.0.0.1:{port}", "--model", "m",
         "--num-prompts", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT_JSON "))
    res = json.loads(line[len("RESULT_JSON ") :], parse_constant=lambda c: pytest.fail(c))
    assert (res["completed"], res["failed"]) == (0, 2)
    assert res["ttft_ms"]["p50"] is None and "ConnectError" in res["errors"][0]
    assert "no request completed" in proc.stderr
    # Without --model the server is asked for one: one error line, no traceback.
    proc = subprocess.run([sys.executable, script, "--port", str(port), "--num-prompts", "2"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: no model from http://127.0.0.1:"), proc.stderr


def test_throughput_reads_upstream_dataset_flags():
    """`--dataset-name random --random-input-len I --random-output-len O` (upstream's
    spelling) is the fixed workload of I prompt and O output tokens."""
    tp = _bench_module("benchmark_throughput")
    args = tp.parse_args(["--dataset-name", "random", "--random-input-len", "32",
                          "--random-output-len", "16", "--num-prompts", "4"])  # fmt: skip
    assert (args.dataset, args.input_len, args.output_len) == ("fixed", 32, 16)
    prompts, out_lens = tp.make_workload(args, args.num_prompts, 1000)
    assert [len(p["prompt_token_ids"]) for p in prompts] == [32] * 4 and out_lens == [16] * 4


def test_serving_benchmark_random_token_prompts(tiny_llama_dir):
    """`--dataset-name random --random-input-len 12 --random-output-len 5` against a tiny
    server: every request completes with exactly 12 prompt and 5 output tokens."""
    import subprocess

    from tests.utils import RemoteOpenAIServer

    with RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", "--max-model-len", "64"]) as srv:
        cmd = [sys.executable, os.path.join(BENCH_DIR, "benchmark_serving.py"), "--base-url",
               srv.url_for("").rstrip("/"), "--dataset-name", "random", "--random-input-len",
               "12", "--random-output-len", "5", "--num-prompts", "3"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT_JSON "))
    res = json.loads(line[len("RESULT_JSON ") :])
    assert (res["completed"], res["dataset"], res["input_len_tokens"]) == (3, "random", 12)
    assert (res["total_input_tokens"], res["total_output_tokens"]) == (36, 15)


def test_percentiles_are_nearest_rank():
    """Nearest rank is the ceil(p% x n)-th smallest value: the p50 of 5 values is the 3rd
    (the median), the p90 of 7 values is the 7th. Rounding p% x n instead (round(2.5) == 2,
    round(6.3) == 6) reported the 2nd of 5 and the 6th of 7, below the percentile."""
    common = _bench_module("bench_common")
    serving = _bench_module("benchmark_serving")
    five, seven = [5.0, 1.0, 4.0, 2.0, 3.0], [float(x) for x in range(1, 8)]
    assert common.percentile(five, 50) == 3.0 and common.percentile(seven, 90) == 7.0
    assert common.percentile(seven, 50) == 4.0 and common.percentile(five, 99) == 5.0
    assert common.percentile([float(x) for x in range(1, 101)], 99) == 99.0
    assert serving.percentiles(five) == {"mean": 3.0, "p50": 3.0, "p90": 5.0, "p99": 5.0}
    assert serving.percentiles(seven)["p90"] == 7.0 and serving.percentiles(seven)["p50"] == 4.0


def test_served_benchmarks_refuse_bad_flags_in_one_line():
    """benchmark_prefix_caching.py and benchmark_chunked_prefill.py refuse a count below 1,
    an empty length range and lengths beyond --max-model-len with one `error:` line and
    exit status 2 before any server starts (they were tracebacks, or failed requests or a
    `randint` error after minutes of serving)."""
    import subprocess

    apc, chunked = (
        _bench_module("benchmark_prefix_caching"),
        _bench_module("benchmark_chunked_prefill"),
    )
    common = _bench_module("bench_common")
    cases = [
        (apc, ["--turns", "0"], "--turns must be at least 1, got 0."),
        (apc, ["--skip-serving", "--min-input-len", "500", "--max-input-len", "100"],
         r"--min-input-len / --max-input-len must satisfy 1 <= min <= max, got \[500, 100\]"),
        (apc, ["--skip-serving", "--max-model-len", "1024"],
         "--max-input-len 1024 \\+ --max-output-len 1024 exceeds --max-model-len 1024"),
        (apc, ["--skip-offline", "--max-model-len", "1300"],
         r"last turn's prompt \(1472 tokens: .*\+ --output-len 64 exceeds --max-model-len 1300"),
        (chunked, ["--stream-prompt-len", "0"], "--stream-prompt-len must be at least 1, got 0"),
        (chunked, ["--long-rate", "nan"], "--long-rate must be positive, got nan"),
        (chunked, ["--stream-prompt-len", "4095"], "--stream-prompt-len 4095 leaves no room"),
    ]  # fmt: skip
    for mod, argv, message in cases:
        with pytest.raises(common.UsageError, match=message):
            mod.main(argv)
    for name in ("benchmark_prefix_caching.py", "benchmark_chunked_prefill.py"):
        proc = subprocess.run([sys.executable, os.path.join(BENCH_DIR, name), "--num-long"
                               if "chunked" in name else "--turns", "0"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith("error: --"), proc.stderr


def test_latency_refuses_a_peak_bandwidth_not_above_zero():
    """--peak-bandwidth 0, a negative value or NaN is refused before the engine starts (0
    was silently dropped, a negative value gave a negative bandwidth_floor_ratio)."""
    lat = _bench_module("benchmark_latency")
    lat._check(lat.make_parser().parse_args(["--peak-bandwidth", "2e11"]))
    for value in ("0", "-4.8e12", "nan"):
        args = lat.make_parser().parse_args([f"--peak-bandwidth={value}"])
        with pytest.raises(ValueError, match="--peak-bandwidth must be above 0"):
            lat._check(args)
