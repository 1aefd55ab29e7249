"""Upstream flags accepted with the values this engine supports, refused otherwise
(vllm/engine/compat_args.py), through the `vllm serve` parser as a script passes them."""

import argparse
import logging

import pytest

from vllm.entrypoints.openai.cli_args import make_server_parser
from vllm.entrypoints.openai.server_args import validate_server_args


def _validate(*argv):
    args = make_server_parser(argparse.ArgumentParser()).parse_args(list(argv))
    return validate_server_args(args)


def test_accepted_values(tiny_llama_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.engine.compat_args"):
        ea = _validate(tiny_llama_dir, "--device", "cpu", "--trust-remote-code",
                       "--tokenizer-mode", "auto", "--kv-cache-dtype", "auto",
                       "--swap-space", "8", "--revision", "main",
                       "--download-dir", "/tmp/hf")  # fmt: skip
    assert ea.trust_remote_code and ea.swap_space == 8.0 and ea.revision == "main"
    assert "revision='main' is ignored" in caplog.text
    assert "download_dir='/tmp/hf' is ignored" in caplog.text
    config = ea.create_engine_config()
    assert config.model_config.trust_remote_code and config.model_config.tokenizer_mode == "auto"


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--quantization", "bitsandbytes"], r"quantization='bitsandbytes' is not supported"),
        (["--quantization", "gguf"], r"quantization='gguf' is not supported.*\.gguf file"),
        (
            ["--tokenizer-mode", "mistral"],
            r"tokenizer_mode='mistral' \(--tokenizer-mode mistral\) is not supported",
        ),
        (["--swap-space", "-1"], r"swap_space must be >= 0 \(GiB\), got -1.0"),
        (["--calculate-kv-scales"], r"calculate_kv_scales=True is not supported.*scale 1"),
    ],
)
def test_refused_values(tiny_llama_dir, flags, match):
    with pytest.raises(ValueError, match=match):
        _validate(tiny_llama_dir, "--device", "cpu", *flags)


def test_gguf_quantization_with_a_gguf_file(smollm2_gguf):
    ea = _validate(smollm2_gguf, "--device", "cpu", "--quantization", "gguf")
    assert ea.quantization == "gguf"


def test_upstream_lora_switches(tiny_llama_dir, caplog):
    """--lora-dtype takes auto or the model's dtype (float32 on CPU), --fully-sharded-loras
    is accepted and logged as ignored; another lora dtype is refused naming the model's."""
    with caplog.at_level(logging.WARNING, logger="vllm.engine.compat_args"):
        for dtype in ("auto", "float32"):
            ea = _validate(tiny_llama_dir, "--device", "cpu", "--enable-lora", "--lora-dtype",
                           dtype, "--fully-sharded-loras")  # fmt: skip
            assert ea.lora_dtype == dtype and ea.fully_sharded_loras is True
            assert ea.create_engine_config().lora_config.max_loras == 1
    assert "fully_sharded_loras=True is ignored" in caplog.text
    with pytest.raises(ValueError, match=r"lora_dtype='bfloat16' is not supported.*'float32'"):
        _validate(tiny_llama_dir, "--device", "cpu", "--enable-lora", "--lora-dtype", "bfloat16")


def test_kv_cache_dtype_choices(tiny_llama_dir, capsys):
    """--kv-cache-dtype lists its choices: the parser refuses another value naming them,
    and EngineArgs (LLM's keyword arguments) refuses it too, before anything loads."""
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(SystemExit):
        _validate(tiny_llama_dir, "--device", "cpu", "--kv-cache-dtype", "int8")
    assert "'fp8', 'fp8_e4m3', 'fp8_e5m2'" in capsys.readouterr().err
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert _validate(tiny_llama_dir, "--device", "cpu", "--kv-cache-dtype", name)
    args = EngineArgs(model=tiny_llama_dir, device="cpu", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match=r"kv_cache_dtype='int8' is not supported.*'fp8_e5m2'"):
        args.create_engine_config()
