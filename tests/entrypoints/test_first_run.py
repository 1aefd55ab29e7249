"""The offline first run: ``LLM()`` with no model uses the default SmolLM2 GGUF (logged),
and every engine logs one start-up summary line with the fields a user checks first."""

import logging
import re

import pytest
import torch

from vllm import LLM, SamplingParams

SUMMARY = re.compile(
    r"Start-up summary: device=(?P<device>.+?), dtype=(?P<dtype>\w+), "
    r"attention=(?P<attention>\w+), kv_cache=(?P<blocks>\d+) blocks x (?P<block_size>\d+) "
    r"tokens per virtual engine \((?P<kv_gib>[\d.]+) GiB\), graphs=(?P<graphs>.+?), "
    r"parallel=(?P<parallel>.+)$"
)


def summary_fields(text: str) -> dict:
    """The fields of the one start-up summary line in ``text`` (fails unless exactly one)."""
    found = [m.groupdict() for line in text.splitlines() if (m := SUMMARY.search(line))]
    assert len(found) == 1, text[-3000:]
    return found[0]


def _kv_gib(worker) -> str:
    nbytes = sum(t.numel() * t.element_size() for ce in worker.cache_engines for t in ce.kv_caches)
    return f"{nbytes / 2**30:.2f}"


@pytest.mark.forked
def test_llm_without_model_uses_the_default_and_generates(smollm2_gguf, caplog, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    with caplog.at_level(logging.INFO, logger="vllm"):
        llm = LLM(device="cpu", max_model_len=128)
    assert llm.engine_args.model == smollm2_gguf
    assert f"No model given: using the default SmolLM2-135M-Instruct GGUF ({smollm2_gguf})" in (
        caplog.text
    )
    out = llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=3))
    assert out[0].outputs[0].text.startswith(" Paris")

    f = summary_fields(caplog.text)
    engine = llm.llm_engine
    assert f["device"] == f"cpu ({torch.get_num_threads()} threads)"
    assert (f["dtype"], f["attention"]) == ("float32", "TORCH_SDPA")
    assert int(f["blocks"]) == engine.config.cache_config.num_gpu_blocks > 0
    assert f["block_size"] == "16"
    assert f["kv_gib"] == _kv_gib(engine.executor.worker)
    assert f["graphs"] == "eager (CUDA graphs need a CUDA device)"
    assert f["parallel"] == "pp 1 x tp 1 (uni executor, 1 virtual engine)"


@pytest.mark.forked
def test_startup_summary_of_two_pipeline_stages(tiny_llama_dir, caplog, monkeypatch):
    """The mp executor's stages report over RPC: each stage's layers appear."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.02")
    with caplog.at_level(logging.INFO, logger="vllm"):
        llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64, pipeline_parallel_size=2)
    try:
        f = summary_fields(caplog.text)
        blocks = llm.llm_engine.config.cache_config.num_gpu_blocks
        assert int(f["blocks"]) == blocks
        # 3 layers over 2 stages (2 + 1); 2 virtual engines of blocks + 1 (scratch) blocks
        assert f["parallel"] == (
            "pp 2 x tp 1 (mp executor, 2 virtual engines; stage 0 layers 0-1, stage 1 layers 2-2)"
        )
        from vllm.worker.cache_engine import cache_block_bytes

        mc = llm.llm_engine.config.model_config
        per_layer = cache_block_bytes(mc, 16, 1)
        expected = 2 * (blocks + 1) * per_layer * mc.num_layers / 2**30
        assert f["kv_gib"] == f"{expected:.2f}"
        assert f["graphs"] == "eager (CUDA graphs need a CUDA device)"
    finally:
        llm.llm_engine.shutdown()


def test_llm_chat_without_template_is_a_clear_error():
    """No engine needed: the check runs before any generation."""
    from vllm.entrypoints.llm import LLM as LLMClass

    class _Tok:
        chat_template = None

    llm = LLMClass.__new__(LLMClass)
    llm.engine_args = type("A", (), {"model": "/m"})()
    llm.get_tokenizer = lambda: _Tok()
    with pytest.raises(ValueError, match="has no chat template: pass chat_template="):
        llm.chat([{"role": "user", "content": "hi"}])


def test_request_log_shows_text_cut_to_max_log_len(caplog):
    """The server's request log line: prompt text when known (chat prompts arrive rendered,
    with their ids), token ids only for an id-only prompt; both cut to max_log_len; the
    LoRA adapter a request names. With --enable-log-outputs a finished request's
    sequences are logged too, their text and ids cut alike."""
    from vllm.engine.request_log import log_output, log_request
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput, RequestOutput

    params = SamplingParams(max_tokens=2)
    outs = [
        CompletionOutput(i, text, list(range(7)), None, None, "length")
        for i, text in enumerate(["Bonjour", "Hi"])
    ]
    with caplog.at_level(logging.INFO, logger="vllm.engine.request_log"):
        log_request("r1", {"prompt": "Hello world", "prompt_token_ids": [7, 8]}, params, None, 5)
        log_request("r2", {"prompt_token_ids": list(range(10))}, params, max_log_len=5)
        log_request("r3", "plain text prompt", params, max_log_len=5)
        log_request("r4", "with adapter", params, LoRARequest("sql", 3, "/adapters/sql"), 5)
        log_output(RequestOutput("r5", None, [1], None, outs[:1], True), 5)
        log_output(RequestOutput("r6", None, [1], None, outs, True))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"Received request r1: prompt: 'Hello', params: {params}.",
        f"Received request r2: prompt_token_ids: [0, 1, 2, 3, 4], params: {params}.",
        f"Received request r3: prompt: 'plain', params: {params}.",
        f"Received request r4: prompt: 'with ', params: {params}, lora_request: "
        "LoRARequest(lora_name='sql', lora_int_id=3, lora_path='/adapters/sql', "
        "base_model_name=None).",
        "Generated response r5: output: 'Bonjo', output_token_ids: [0, 1, 2, 3, 4], "
        "finish_reason: length.",
        "Generated response r6 (sequence 0): output: 'Bonjour', output_token_ids: "
        "[0, 1, 2, 3, 4, 5, 6], finish_reason: length.",
        "Generated response r6 (sequence 1): output: 'Hi', output_token_ids: "
        "[0, 1, 2, 3, 4, 5, 6], finish_reason: length.",
    ]


def test_summary_counts_captured_graphs():
    """The graphs field on a CUDA engine: every VE's decode, prefill and loop graphs (and
    piecewise sizes when any), the longest stage's capture seconds and the stages' capture
    GiB (fake runner, no GPU)."""
    from types import SimpleNamespace as NS

    from vllm.worker.startup_summary import _graph_count, format_summary

    sizes = {"decode": [1, 2, 4, 8], "prefill": [16, 24], "loop": [1], "piecewise": [16, 32, 48]}

    class _Runner:
        def captured_sizes(self, ve, kind):
            return sizes[kind]

    assert _graph_count(_Runner(), 2) == 14
    assert _graph_count(_Runner(), 2, ("piecewise",)) == 6
    config = NS(
        device_config=NS(device="cuda"),
        compilation_config=NS(enforce_eager=False),
        cache_config=NS(num_gpu_blocks=100, block_size=16, cache_dtype="auto"),
        parallel_config=NS(
            pipeline_parallel_size=2, tensor_parallel_size=1, distributed_executor_backend="mp"
        ),
        num_virtual_engines=2,
    )
    stage = dict(device="cuda:0 (H)", dtype="bfloat16", attention="FLASHINFER", kv_bytes=2**30,
                 piecewise=0)  # fmt: skip
    stages = [
        {**stage, "rank": 0, "layers": (0, 15), "graphs": 14, "graph_seconds": 1.5,
         "graph_bytes": 2**29},
        {**stage, "rank": 1, "device": "cuda:1 (H)", "layers": (15, 30), "graphs": 14,
         "graph_seconds": 2.25, "graph_bytes": 2**29},
    ]  # fmt: skip
    assert format_summary(config, stages) == (
        "Start-up summary: device=cuda:0 (H), cuda:1 (H), dtype=bfloat16, attention=FLASHINFER, "
        "kv_cache=100 blocks x 16 tokens per virtual engine (2.00 GiB), graphs=28 captured in "
        "2.25 s (1.00 GiB), parallel=pp 2 x tp 1 (mp executor, 2 virtual engines; stage 0 "
        "layers 0-14, stage 1 layers 15-29)"
    )
    config.cache_config.cache_dtype = "fp8"
    assert "per virtual engine (2.00 GiB in fp8), graphs=" in format_summary(config, stages)
    config.cache_config.cache_dtype = "auto"
    stages[0]["piecewise"] = 10  # one stage's VE with pieces of 10 token counts
    assert "graphs=28 captured and 10 piecewise sizes in 2.25 s (1.00 GiB)," in format_summary(
        config, stages
    )
    config.speculative_config = NS(
        num_speculative_tokens=3,
        is_ngram=True,
        ngram_prompt_lookup_min=1,
        ngram_prompt_lookup_max=4,
    )
    assert format_summary(config, stages).endswith(
        "stage 1 layers 15-29), speculation=ngram k=3 (n-grams 1-4)"
    )
    config.speculative_config = NS(
        num_speculative_tokens=4, is_ngram=False, speculative_model="/m/draft"
    )
    assert format_summary(config, stages).endswith(", speculation=draft /m/draft k=4")
    config.speculative_config = None
    config.compilation_config.enforce_eager = True
    for s in stages:
        s["graphs"] = s["piecewise"] = 0
    assert "graphs=eager (--enforce-eager)," in format_summary(config, stages)
