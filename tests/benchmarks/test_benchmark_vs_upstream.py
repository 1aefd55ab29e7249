"""benchmarks/benchmark_vs_upstream.py and convert_gguf_to_hf.py on CPU with this engine:
the GGUF -> HF conversion is exact, and the side-by-side script detects the engine, states
its flags and reports self-consistent lines for batch and nano workloads (tiny sizes), and
profile_engine_calls.py accounts for every model call of those workloads."""

import argparse
import json
import os

import pytest

from tests.benchmarks.test_benchmark_scripts import BENCH_DIR, _bench_module

REPO_VLLM = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "vllm"))


@pytest.mark.forked
def test_convert_then_compare_script_on_this_engine(
    tiny_llama_gguf, tiny_llama_dir, tmp_path, capsys, monkeypatch
):
    """The F32 tiny GGUF converted to bfloat16 equals the original checkpoint cast to
    bfloat16 (q/k rows un-permuted); the benchmark then runs on the converted directory."""
    import torch
    from safetensors.torch import load_file

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    conv = _bench_module("convert_gguf_to_hf")
    out_dir = str(tmp_path / "hf")
    summary = conv.convert(tiny_llama_gguf, out_dir, "bfloat16")
    want = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    got = load_file(os.path.join(out_dir, "model.safetensors"))
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert got[name].dtype == torch.bfloat16, name
        assert torch.equal(got[name], w.to(torch.bfloat16)), name
    assert summary["num_parameters"] == sum(w.numel() for w in want.values())
    with open(os.path.join(out_dir, "config.json")) as f:
        assert "quantization_config" not in json.load(f)
    with pytest.raises(ValueError, match="not empty"):
        conv.convert(tiny_llama_gguf, out_dir, "bfloat16")

    bench = _bench_module("benchmark_vs_upstream")
    jsonl = tmp_path / "vs.jsonl"
    argv = ["--model", out_dir, "--device", "cpu", "--dtype", "float32", "--max-model-len",
            "64", "--workloads", "1,3,nano", "--input-len", "6", "--output-len", "5",
            "--num-prompts", "3", "--min-len", "4", "--max-len", "9", "--num-iters", "2",
            "--expect-engine", "fork", "--output-json", str(jsonl)]  # fmt: skip
    records = bench.main(argv)
    out = capsys.readouterr().out
    assert out.index("benchmark_vs_upstream conditions") < out.index('{"bench"')
    printed = [json.loads(x) for x in out.splitlines() if x.startswith('{"bench"')]
    assert printed == records == [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [r["workload"] for r in records] == ["batch1", "batch3", "nano"]

    import vllm

    # The same requests as benchmark_throughput.py --dataset random-range.
    tp = _bench_module("benchmark_throughput")
    ns = argparse.Namespace(dataset="random-range", seed=0, min_input_len=4, max_input_len=9,
                            min_output_len=4, max_output_len=9)  # fmt: skip
    nano_prompts, nano_out = tp.make_workload(ns, 3, 4)
    nano_in = sum(len(p["prompt_token_ids"]) for p in nano_prompts)
    expected = {"batch1": (1, 6, 5), "batch3": (3, 18, 15), "nano": (3, nano_in, sum(nano_out))}
    for r in records:
        assert (r["engine"], r["version"], r["module"]) == ("fork", vllm.__version__, REPO_VLLM)
        assert r["llm_kwargs"] == {
            "model": out_dir, "dtype": "float32", "seed": 0, "max_model_len": 64,
            "load_format": "auto", "device": "cpu", "num_scheduler_steps": 32,
            "max_num_batched_tokens": 16384,
        }  # fmt: skip
        assert (r["num_requests"], r["input_tokens"], r["output_tokens"]) == expected[r["workload"]]
        assert r["num_iters"] == len(r["elapsed_s_each"]) == 2
        assert r["detokenize"] is True
        assert r["elapsed_s"] == pytest.approx(sum(r["elapsed_s_each"]) / 2, abs=1e-3)
        assert r["output_tokens_per_s"] == pytest.approx(
            r["output_tokens"] / r["elapsed_s"], rel=1e-2
        )
        assert r["gpu"] == "cpu" and r["startup_s"] > 0

    # dummy weights: no tokenizer (skip_tokenizer_init), token ids only, nothing decoded
    argv = ["--model", tiny_llama_dir, "--load-format", "dummy", "--device", "cpu", "--dtype",
            "float32", "--max-model-len", "64", "--workloads", "2", "--input-len", "4",
            "--output-len", "3"]  # fmt: skip
    (dummy,) = bench.main(argv)
    assert dummy["llm_kwargs"]["skip_tokenizer_init"] is True and dummy["detokenize"] is False
    assert (dummy["workload"], dummy["output_tokens"]) == ("batch2", 6)


def test_compare_script_checks_its_inputs(tmp_path):
    """Bad workloads, bounds and flags are refused by name; --expect-engine upstream fails
    under this engine before any engine starts."""
    bench = _bench_module("benchmark_vs_upstream")
    assert bench.detect_engine()["engine"] == "fork"
    assert bench.parse_workloads("1, 8,nano") == ["1", "8", "nano"]
    for bad in ("0", "8,big", ""):
        with pytest.raises(ValueError, match="workloads"):
            bench.parse_workloads(bad)
    qwen = os.path.join(BENCH_DIR, "configs", "qwen2.5-0.5b")
    assert bench.vocab_size(qwen) == 151936
    with pytest.raises(ValueError, match="config.json"):
        bench.vocab_size(str(tmp_path))
    with pytest.raises(RuntimeError, match="--expect-engine upstream"):
        bench.main(["--model", qwen, "--load-format", "dummy", "--expect-engine", "upstream"])
    with pytest.raises(ValueError, match="--min-len"):
        bench.main(["--model", qwen, "--min-len", "10", "--max-len", "5"])
    with pytest.raises(ValueError, match="--max-model-len 1024"):
        bench.main(["--model", qwen, "--max-model-len", "1024", "--workloads", "nano"])
    args = bench.make_parser().parse_args(["--model", qwen, "--load-format", "dummy"])
    assert bench.llm_kwargs(args, "upstream") == {
        "model": qwen, "dtype": "bfloat16", "seed": 0, "max_model_len": 4096,
        "load_format": "dummy", "skip_tokenizer_init": True,
    }  # fmt: skip
    args.engine_kwargs = {"max_num_seqs": 64}
    assert bench.llm_kwargs(args, "fork")["max_num_seqs"] == 64
    assert "num_scheduler_steps" not in bench.llm_kwargs(args, "fork")


def test_compare_script_refuses_bad_flags_in_one_line(tmp_path):
    """Run as a script, a bad flag value or a model without config.json is one `error:`
    line and exit status 2 before any engine starts (it was a traceback)."""
    import subprocess
    import sys

    script = os.path.join(BENCH_DIR, "benchmark_vs_upstream.py")
    qwen = os.path.join(BENCH_DIR, "configs", "qwen2.5-0.5b")
    cases = [
        (["--model", qwen, "--num-iters", "0"], "error: --num-iters must be >= 1, got 0"),
        (["--model", qwen, "--workloads", "bogus"], "error: --workloads: 'bogus' is neither"),
        (["--model", str(tmp_path)], "error: --model must be a directory with config.json"),
        ([], "error: --model is required (unless --summarize)"),
    ]
    for argv, start in cases:
        proc = subprocess.run([sys.executable, script, *argv],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(start), last


def test_summarize_pairs_engines_by_model_and_workload(tmp_path):
    bench = _bench_module("benchmark_vs_upstream")

    def rec(engine, workload, tps, model="m"):
        return {"bench": "vs_upstream", "engine": engine, "version": engine[0], "model": model,
                "workload": workload, "output_tokens_per_s": tps, "startup_s": 1.0,
                "llm_kwargs": {"e": engine}}  # fmt: skip

    rows = [rec("upstream", "batch1", 400.0), rec("fork", "batch1", 1500.0),
            rec("fork", "nano", 9.0), rec("upstream", "batch1", 50.0, model="other")]  # fmt: skip
    path = tmp_path / "r.jsonl"
    path.write_text("noise\n" + "".join(json.dumps(r) + "\n" for r in rows))
    (ratio,) = bench.main(["--summarize", str(path)])
    assert (ratio["model"], ratio["workload"], ratio["ratio"]) == ("m", "batch1", 3.75)
    assert (ratio["upstream_version"], ratio["fork_version"]) == ("u", "f")
    assert ratio["fork_llm_kwargs"] == {"e": "fork"}


@pytest.mark.forked
def test_engine_calls_profile_accounts_for_every_call(tiny_llama_dir, capsys, monkeypatch):
    """profile_engine_calls.py on CPU: the prefill calls compute every prompt token, the
    decode calls return at least every token after the first, the width buckets hold every
    decode call, and the timed parts fit in the iteration's wall time."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    prof = _bench_module("profile_engine_calls")
    argv = ["--model", tiny_llama_dir, "--device", "cpu", "--dtype", "float32",
            "--max-model-len", "64", "--workloads", "3,nano", "--input-len", "6",
            "--output-len", "5", "--num-prompts", "4", "--min-len", "4", "--max-len", "9",
            "--num-iters", "1", "--bucket", "2", "--engine-kwargs",
            '{"num_scheduler_steps": 2}']  # fmt: skip
    records = prof.main(argv)
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert printed == records and [r["workload"] for r in records] == ["batch3", "nano"]
    bench = _bench_module("benchmark_vs_upstream")
    args = bench.make_parser().parse_args(argv[:-4])  # without --bucket, --engine-kwargs
    for r in records:
        in_lens, out_lens = bench.workload_lengths(r["workload"].removeprefix("batch"), args)
        assert r["prefill"]["tokens"] == sum(in_lens)
        assert r["decode"]["tokens"] >= sum(out_lens) - len(out_lens)
        assert r["decode"]["calls"] >= max(out_lens) // 2  # two tokens a call at most
        buckets = r["decode_by_rows"]
        assert sum(n for n, _, _ in buckets.values()) == r["decode"]["calls"]
        assert all(int(b) % 2 == 0 and int(b) <= 2 * len(in_lens) for b in buckets)
        parts = r["prefill"]["s"] + r["decode"]["s"] + r["between_calls_s"]
        assert 0 < parts <= r["elapsed_s"] + 1e-3
    with pytest.raises(ValueError, match="--bucket must be >= 1, got 0"):
        prof.main(argv[:-4] + ["--bucket", "0"])


def test_default_step_budget_covers_the_longest_prompt():
    """This engine's default 16384-token step budget grows to a longer --max-model-len
    (the engine refuses a budget below it without chunked prefill); given
    --engine-kwargs are passed as they are."""
    bench = _bench_module("benchmark_vs_upstream")
    parse = bench.make_parser().parse_args
    kw = bench.llm_kwargs(parse(["--model", "m", "--max-model-len", "32768"]), "fork")
    assert kw["max_num_batched_tokens"] == 32768 and kw["num_scheduler_steps"] == 32
    kw = bench.llm_kwargs(parse(["--model", "m"]), "fork")
    assert kw["max_num_batched_tokens"] == 16384 and kw["max_model_len"] == 4096
    assert "max_num_batched_tokens" not in bench.llm_kwargs(parse(["--model", "m"]), "upstream")
    given = ["--model", "m", "--max-model-len", "32768", "--engine-kwargs", '{"x": 1}']
    assert bench.llm_kwargs(parse(given), "fork")["x"] == 1
    assert "max_num_batched_tokens" not in bench.llm_kwargs(parse(given), "fork")
