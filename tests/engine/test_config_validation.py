"""Bad engine arguments fail in config validation, before any weight load, naming the value."""

import pytest

from vllm.engine.arg_utils import EngineArgs


@pytest.fixture(autouse=True)
def _no_weight_loading(monkeypatch):
    """Any attempt to build a model during these tests is a failure."""
    import vllm.model_executor.model_loader as loader

    def boom(*a, **k):
        raise AssertionError("weights were loaded before validation failed")

    monkeypatch.setattr(loader, "get_model", boom)


CASES = [
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(load_format="pt"), "load_format must be one of"),
    (dict(device="tpu"), "device must be one of"),
    (dict(max_model_len=10**6), "max_position_embeddings"),
    (dict(max_model_len=512, max_num_batched_tokens=256), "max_num_batched_tokens=256"),
    (dict(block_size=3), "block_size must be a power of two"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be in (0, 1]"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization must be in (0, 1]"),
    (dict(num_gpu_blocks_override=0), "num_gpu_blocks_override must be at least 1"),
    (dict(kv_cache_memory_bytes=0), "kv_cache_memory_bytes must be at least 1, got 0"),
    (dict(max_num_seqs=0), "max_num_seqs must be at least 1"),
    (dict(tensor_parallel_size=3), "num_attention_heads=4 is not divisible by tensor_parall"),
    (dict(max_num_batched_tokens=64), "max_num_batched_tokens=64 is smaller than max_model_len"),
    (
        dict(enable_chunked_prefill=True, max_num_partial_prefills=0),
        "max_num_partial_prefills must be at least 1",
    ),
    (
        dict(max_num_partial_prefills=2),
        "max_num_partial_prefills=2 needs enable_chunked_prefill=True",
    ),
    (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be at least 1"),
    (dict(pipeline_parallel_size=4), "pipeline_parallel_size=4 is larger than the model's 3"),
    (dict(distributed_executor_backend="slurm"), "distributed_executor_backend must be one of"),
    (dict(max_cudagraph_capture_size=0), "max_cudagraph_capture_size must be at least 1"),
    (dict(cuda_graph_sizes=[0, 8]), "cuda_graph_sizes"),
    (
        dict(prefix_caching_hash_algo="xxhash"),
        "prefix_caching_hash_algo must be 'sha256', got 'xxhash'",
    ),
    (
        dict(logprobs_mode="logits"),
        "logprobs_mode must be one of ['raw_logprobs', 'raw_logits', 'processed_logprobs', "
        "'processed_logits'], got 'logits'.",
    ),
]


@pytest.mark.parametrize("kwargs,message", CASES, ids=[str(c[0]) for c in CASES])
def test_bad_engine_args(tiny_llama_dir, kwargs, message):
    with pytest.raises(ValueError) as e:
        EngineArgs(model=tiny_llama_dir, **kwargs).create_engine_config()
    assert message in str(e.value)


def test_missing_model_path():
    with pytest.raises(ValueError, match="does not exist"):
        EngineArgs(model="/nonexistent/model").create_engine_config()


def test_unknown_architecture(tiny_llama_dir, tmp_path):
    import json
    import shutil

    d = tmp_path / "weird"
    shutil.copytree(tiny_llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        EngineArgs(model=str(d)).create_engine_config()
    assert "MambaForCausalLM" in str(e.value)
    assert "LlamaForCausalLM" in str(e.value) and "Qwen2ForCausalLM" in str(e.value)


def _remote_code_checkpoint(tiny_llama_dir, path) -> str:
    """A copy of ``tiny_llama_dir`` whose config class is the checkpoint's own code
    (``auto_map``: a LlamaConfig subclass of model_type ``my_llama`` that transformers does
    not know)."""
    import json
    import shutil

    shutil.copytree(tiny_llama_dir, path)
    (path / "configuration_my.py").write_text(
        "from transformers import LlamaConfig\n\n\n"
        "class MyLlamaConfig(LlamaConfig):\n    model_type = 'my_llama'\n"
    )
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "my_llama"
    cfg["auto_map"] = {"AutoConfig": "configuration_my.MyLlamaConfig"}
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def test_trust_remote_code_reaches_the_config(tiny_llama_dir, tmp_path, monkeypatch):
    """A config that needs its own code (auto_map) loads with trust_remote_code=True, and
    without it fails with an error naming --trust-remote-code instead of transformers asking
    on the terminal (stdin is made to fail, so a prompt would show here)."""
    import io

    model = _remote_code_checkpoint(tiny_llama_dir, tmp_path / "remote")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # input() raises EOFError
    with pytest.raises(ValueError, match="needs its own code .* only with --trust-remote-code"):
        EngineArgs(model=model).create_engine_config()
    config = EngineArgs(model=model, trust_remote_code=True).create_engine_config()
    assert type(config.model_config.hf_config).__name__ == "MyLlamaConfig"
    assert config.model_config.hf_config.num_hidden_layers == 3


@pytest.mark.parametrize(
    "config, reason",
    [
        (None, r"OSError: .*not a valid JSON file"),
        (
            {"model_type": "smollm3", "no_rope_layer_interval": 0},
            r"ZeroDivisionError: integer modulo by zero",
        ),
        (
            {"model_type": "granite", "attention_multiplier": None},
            r"StrictDataclassFieldValidationError: .*'attention_multiplier' with value None",
        ),
    ],
)
def test_config_transformers_refuses_is_a_value_error(tmp_path, config, reason):
    """A config.json that transformers cannot build (bad JSON, a field its own checks
    refuse) is a ValueError naming the directory and transformers' reason, so ``vllm serve``
    prints one ``error:`` line, not the traceback of ZeroDivisionError or huggingface_hub's
    dataclass errors."""
    import json

    model = tmp_path / "refused"
    model.mkdir()
    text = "{not json" if config is None else json.dumps(config)
    (model / "config.json").write_text(text)
    with pytest.raises(ValueError, match=rf"config.json of '{model}' is refused .*{reason}"):
        EngineArgs(model=str(model)).create_engine_config()


def test_bad_cpu_kvcache_space(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        EngineArgs(model=tiny_llama_dir).create_engine_config()


def test_defaults(tiny_llama_dir):
    import torch

    cfg = EngineArgs(model=tiny_llama_dir, device="cpu").create_engine_config()
    assert cfg.model_config.dtype == torch.float32
    assert cfg.cache_config.block_size == 16
    assert cfg.scheduler_config.max_num_seqs == 256
    assert cfg.scheduler_config.max_num_batched_tokens == max(cfg.model_config.max_model_len, 2048)
    assert cfg.parallel_config.distributed_executor_backend == "uni"
    assert cfg.cache_config.prefix_caching_hash_algo == "sha256"


@pytest.mark.parametrize(
    "kwargs, device, expected",
    [
        (dict(enable_chunked_prefill=True), "cuda", 512),
        (dict(), "cuda", 0),
        (dict(enable_chunked_prefill=True), "cpu", 0),
        (dict(enable_chunked_prefill=True, enforce_eager=True), "cuda", 0),
        (dict(enable_chunked_prefill=True, pipeline_parallel_size=2), "cuda", 0),
        (dict(enable_chunked_prefill=True, tensor_parallel_size=2), "cuda", 0),
        (dict(enable_chunked_prefill=True, piecewise_graph_max_tokens=0), "cuda", 0),
        (dict(piecewise_graph_max_tokens=256), "cpu", 256),
    ],
)
def test_piecewise_default(kwargs, device, expected):
    """--piecewise-graph-max-tokens unset: 512 for chunked prefill with graphs on one CUDA
    device, else 0; a given value is kept as is."""
    args = EngineArgs(model="m", **kwargs)
    assert args._piecewise_graph_max_tokens(device) == expected


def test_piecewise_default_reaches_the_config(tiny_llama_dir):
    cfg = EngineArgs(model=tiny_llama_dir, device="cpu", enable_chunked_prefill=True)
    assert cfg.create_engine_config().compilation_config.piecewise_graph_max_tokens == 0
    cfg = EngineArgs(model=tiny_llama_dir, device="cpu", piecewise_graph_max_tokens=64)
    assert cfg.create_engine_config().compilation_config.piecewise_graph_max_tokens == 64


def test_unknown_llm_kwarg(tiny_llama_dir):
    from vllm import LLM

    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(model=tiny_llama_dir, max_num_seq=4)


def test_cli_flags_come_from_fields():
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--max-num-seqs",
            "8",
            "--enforce-eager",
            "--cuda-graph-sizes",
            "1",
            "2",
            "--dtype",
            "half",
        ]
    )
    ea = EngineArgs.from_cli_args(args)
    assert (ea.max_num_seqs, ea.enforce_eager, ea.cuda_graph_sizes, ea.dtype) == (
        8,
        True,
        [1, 2],
        "half",
    )


def test_logprobs_mode_flag_and_kwarg(tiny_llama_dir, capsys):
    """--logprobs-mode takes upstream's four choices (raw_logprobs by default) into the
    ModelConfig; argparse refuses another value naming the choices, LLM() a ValueError."""
    from vllm import LLM
    from vllm.utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for argv, mode in (([], "raw_logprobs"), (["--logprobs-mode", "processed_logits"],
                                              "processed_logits")):  # fmt: skip
        ea = EngineArgs.from_cli_args(parser.parse_args(["--model", tiny_llama_dir, *argv]))
        assert ea.create_engine_config().model_config.logprobs_mode == mode
    with pytest.raises(SystemExit):
        parser.parse_args(["--logprobs-mode", "processed"])
    err = capsys.readouterr().err
    assert "invalid choice: 'processed'" in err and "processed_logprobs" in err
    with pytest.raises(ValueError, match="logprobs_mode must be one of .*got 'raw'"):
        LLM(model=tiny_llama_dir, device="cpu", logprobs_mode="raw")


def test_flashinfer_head_size(monkeypatch):
    """FlashInfer has kernels for head sizes 64/128/256 only: an explicit choice with
    another fails with the size named; the default choice falls back to TORCH_SDPA."""
    import torch

    from vllm.attention.selector import which_attn_backend

    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    assert which_attn_backend("cuda", torch.bfloat16, 16) == "TORCH_SDPA"
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    with pytest.raises(ValueError, match=r"head_size=16 \(supported: \[64, 128, 256\]\)"):
        which_attn_backend("cuda", torch.bfloat16, 16)


def test_attention_backend_flag_wins_over_the_variable(tiny_llama_dir, monkeypatch):
    """``--attention-backend`` (any case) picks the backend where VLLM_ATTENTION_BACKEND
    would have picked another, and a choice that cannot run, or one of upstream's backends
    this engine lacks, fails before any load, naming the flag."""
    import argparse

    import torch

    from vllm.attention.selector import which_attn_backend

    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    assert which_attn_backend("cuda", torch.bfloat16, 64, "torch_sdpa") == "TORCH_SDPA"
    with pytest.raises(ValueError, match="VLLM_ATTENTION_BACKEND=FLASHINFER needs device"):
        which_attn_backend("cpu", torch.float32, 64)
    cfg = EngineArgs(model=tiny_llama_dir, device="cpu", attention_backend="torch_sdpa")
    assert cfg.create_engine_config().device_config.attention_backend == "torch_sdpa"
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--attention-backend", "FLASH_ATTN"]))
    assert args.attention_backend == "FLASH_ATTN"
    with pytest.raises(
        ValueError,
        match=r"--attention-backend=FLASH_ATTN is not available "
        r"here: the attention backends are \['FLASHINFER', 'TORCH_SDPA'\]",
    ):
        EngineArgs(
            model=tiny_llama_dir, device="cpu", attention_backend=args.attention_backend
        ).create_engine_config()
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND")
    with pytest.raises(ValueError, match="--attention-backend=FLASHINFER needs device='cuda'"):
        EngineArgs(
            model=tiny_llama_dir, device="cpu", attention_backend="flashinfer"
        ).create_engine_config()


def test_long_max_model_len_allowed_by_env(tiny_llama_dir, monkeypatch):
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets max_model_len exceed max_position_embeddings
    (as upstream), with a warning; unset, the same value is refused naming the switch."""
    from transformers import AutoConfig

    limit = AutoConfig.from_pretrained(tiny_llama_dir).max_position_embeddings
    with pytest.raises(ValueError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows it"):
        EngineArgs(model=tiny_llama_dir, max_model_len=limit + 16).create_engine_config()
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    config = EngineArgs(model=tiny_llama_dir, max_model_len=limit + 16).create_engine_config()
    assert config.model_config.max_model_len == limit + 16
    # The config the model was trained with is kept (RoPE scalings read it); the rotary
    # tables are sized from max_model_len instead (next test).
    assert config.model_config.hf_config.max_position_embeddings == limit


@pytest.mark.forked
def test_long_max_model_len_generates_past_the_config_limit(tiny_llama_dir, monkeypatch):
    """A prompt past max_position_embeddings (512) generates instead of failing the step."""
    monkeypatch.undo()  # this one loads weights (the module's fixture forbids it)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=600)
    out = llm.generate({"prompt_token_ids": [5] * 560}, SamplingParams(max_tokens=4))[0]
    assert len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "text,value", [("4096", 4096), ("4k", 4000), ("25.6k", 25600), ("4K", 4096), ("1M", 2**20)]
)
def test_max_model_len_flag_reads_suffixes(text, value):
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    assert parser.parse_args(["--max-model-len", text]).max_model_len == value


@pytest.mark.parametrize(
    "text,value",
    [("1000000", 10**6), ("20G", 20 * 2**30), ("20g", 20 * 10**9), ("1.5M", 3 * 2**19)],
)
def test_kv_cache_memory_bytes_flag_reads_suffixes(text, value):
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--kv-cache-memory-bytes", text])
    assert args.kv_cache_memory_bytes == value
    assert EngineArgs.from_cli_args(args).kv_cache_memory_bytes == value


def test_max_model_len_flag_refuses_fractions(capsys):
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-model-len", "1.3K"])  # 1331.2 tokens
    assert "expected an integer such as 4096, 4k (4000) or 4K (4096)" in capsys.readouterr().err
