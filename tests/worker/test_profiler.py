"""LLM.start_profile / stop_profile (CPU): with VLLM_TORCH_PROFILER_DIR set, one Chrome trace
per worker rank holding the model's ops; a second stop or a start without the variable is a
RuntimeError naming the problem."""

import glob
import gzip
import json
import os

import pytest

from vllm import LLM, SamplingParams


def _trace_ops(path: str) -> set[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return {e.get("name", "") for e in json.load(f)["traceEvents"]}


@pytest.mark.forked
@pytest.mark.parametrize("pp", [1, 2])
def test_profile_writes_one_trace_per_rank(tiny_llama_dir, tmp_path, monkeypatch, pp):
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64, pipeline_parallel_size=pp)
    try:
        llm.start_profile()
        with pytest.raises(RuntimeError, match="already running"):
            llm.start_profile()
        llm.generate([1, 2, 3], SamplingParams(max_tokens=4), use_tqdm=False)
        llm.stop_profile()
        with pytest.raises(RuntimeError, match="no profile is running"):
            llm.stop_profile()
    finally:
        llm.llm_engine.shutdown()
    traces = sorted(glob.glob(os.path.join(tmp_path, "*.pt.trace.json*")))
    names = sorted(os.path.basename(t).split(".")[0] for t in traces)
    assert names == [f"rank{r}" for r in range(pp)], traces
    for t in traces:
        ops = _trace_ops(t)
        assert any(op.startswith("aten::") for op in ops), sorted(ops)[:20]


@pytest.mark.forked
def test_profile_needs_the_directory(tiny_llama_dir, monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64)
    with pytest.raises(RuntimeError, match="VLLM_TORCH_PROFILER_DIR"):
        llm.start_profile()
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2), use_tqdm=False)


def test_server_profile_routes(tiny_llama_dir, tmp_path):
    """`vllm serve` with VLLM_TORCH_PROFILER_DIR: POST /start_profile, a request, POST
    /stop_profile write the trace; a second stop is a 400 naming the reason."""
    import httpx

    from tests.utils import RemoteOpenAIServer

    env = {"VLLM_TORCH_PROFILER_DIR": str(tmp_path)}
    with RemoteOpenAIServer(
        tiny_llama_dir, ["--device", "cpu", "--max-model-len", "64"], env=env
    ) as srv:
        assert httpx.post(srv.url_for("start_profile"), timeout=60).status_code == 200
        body = {"model": os.path.basename(tiny_llama_dir.rstrip("/")), "prompt": [1, 2, 3],
                "max_tokens": 3}  # fmt: skip
        assert (
            httpx.post(srv.url_for("v1", "completions"), json=body, timeout=60).status_code == 200
        )
        assert httpx.post(srv.url_for("stop_profile"), timeout=120).status_code == 200
        again = httpx.post(srv.url_for("stop_profile"), timeout=60)
        assert again.status_code == 400 and "no profile is running" in again.text
    assert glob.glob(os.path.join(tmp_path, "rank0.*.pt.trace.json*"))
