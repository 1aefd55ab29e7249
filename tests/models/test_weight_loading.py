"""Our loaders put exactly the reference weights into every parameter (CPU, float32).

The reference is Hugging Face transformers loading the same checkpoint (safetensors directory,
or the GGUF file dequantized with ``GgufConfig(dequantize=True)``). Fused parameters must equal
the concatenation of their parts: ``qkv_proj = cat(q, k, v)``, ``gate_up_proj = cat(gate, up)``.
"""

import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import load_hf_config, load_hf_model

from vllm.model_executor.model_loader import get_model
from vllm.model_executor.models import ModelRegistry, get_model_class

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# SmolLM2 reference state dict is loaded once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_weight_loading")


def model_config(path: str, hf_config, load_format: str = "auto", seed: int = 0):
    """The attributes of vllm.config.ModelConfig that get_model relies on."""
    return SimpleNamespace(
        model=path,
        hf_config=hf_config,
        dtype=torch.float32,
        load_format=load_format,
        seed=seed,
        max_model_len=None,
    )


def load_hf_state_dict(path: str) -> dict[str, torch.Tensor]:
    """Reference parameters as transformers loads them, float32."""
    return {k: v.detach() for k, v in load_hf_model(path).state_dict().items()}


def expected_param(name: str, hf: dict[str, torch.Tensor]) -> torch.Tensor:
    """The HF tensor (or concatenation) that our parameter ``name`` must hold."""
    parts = name.split(".")
    if parts[-2] == "qkv_proj":
        base, kind = ".".join(parts[:-2]), parts[-1]
        return torch.cat([hf[f"{base}.{p}_proj.{kind}"] for p in "qkv"])
    if parts[-2] == "gate_up_proj":
        base, kind = ".".join(parts[:-2]), parts[-1]
        return torch.cat([hf[f"{base}.gate_proj.{kind}"], hf[f"{base}.up_proj.{kind}"]])
    if name == "lm_head.weight" and name not in hf:
        return hf["model.embed_tokens.weight"]
    return hf[name]


def assert_params_equal(model: torch.nn.Module, hf: dict[str, torch.Tensor]) -> int:
    count = 0
    for name, param in model.named_parameters():
        want = expected_param(name, hf)
        assert param.dtype == torch.float32
        assert param.shape == want.shape, name
        assert torch.equal(param, want), f"{name}: max diff {(param - want).abs().max()}"
        count += 1
    return count


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_gguf):
    return load_hf_state_dict(smollm2_gguf)


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_llama_tied_dir", "tiny_qwen2_dir"])
def test_safetensors_dir_matches_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    hf_config = load_hf_config(path)
    model = get_model(model_config(path, hf_config), "cpu")
    assert not model.training
    assert model.start_layer == 0 and model.end_layer == hf_config.num_hidden_layers
    n = assert_params_equal(model, load_hf_state_dict(path))
    # per layer: qkv, o, gate_up, down, 2 norms (+ qkv bias for Qwen2); then embed, norm
    # and lm_head when untied
    per_layer = 7 if hf_config.model_type == "qwen2" else 6
    assert n == per_layer * hf_config.num_hidden_layers + 2 + (not hf_config.tie_word_embeddings)
    if hf_config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    if hf_config.model_type == "qwen2":
        bias = model.model.layers[0].self_attn.qkv_proj.bias
        assert bias is not None and bias.abs().sum() > 0


@pytest.mark.parametrize("fixture", ["tiny_llama_gguf", "tiny_qwen2_gguf"])
def test_tiny_gguf_matches_transformers_and_safetensors(fixture, request):
    path = request.getfixturevalue(fixture)
    hf_config = load_hf_config(path)
    model = get_model(model_config(path, hf_config), "cpu")
    assert_params_equal(model, load_hf_state_dict(path))
    # The GGUF was written from the safetensors dir: un-permuting q/k must give it back exactly.
    hf_dir = request.getfixturevalue(fixture.replace("_gguf", "_dir"))
    assert_params_equal(model, load_file(os.path.join(hf_dir, "model.safetensors")))


def test_smollm2_gguf_matches_transformers(smollm2_gguf, smollm2_reference):
    hf_config = load_hf_config(smollm2_gguf)
    assert hf_config.tie_word_embeddings and hf_config.num_hidden_layers == 30
    model = get_model(model_config(smollm2_gguf, hf_config), "cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert assert_params_equal(model, smollm2_reference) == 30 * 6 + 2


def test_smollm2_gguf_pipeline_stage(smollm2_gguf, smollm2_reference):
    """The last of 4 stages owns layers [23, 30), the norm and a tied lm_head filled from
    token_embd; it has no embedding of its own."""
    hf_config = load_hf_config(smollm2_gguf)
    model = get_model(model_config(smollm2_gguf, hf_config), "cpu", pp_rank=3, pp_size=4)
    assert (model.start_layer, model.end_layer) == (23, 30)
    assert model.model.embed_tokens is None and model.model.norm is not None
    names = {name for name, _ in model.named_parameters()}
    assert not any(".layers.22." in n for n in names) and "lm_head.weight" in names
    assert assert_params_equal(model, smollm2_reference) == 7 * 6 + 2


@pytest.mark.parametrize("pp_size", [2, 3])
def test_pipeline_stages_partition_the_weights(tiny_llama_dir, pp_size):
    hf_config = load_hf_config(tiny_llama_dir)
    hf = load_hf_state_dict(tiny_llama_dir)
    seen: set[str] = set()
    for rank in range(pp_size):
        model = get_model(model_config(tiny_llama_dir, hf_config), "cpu", rank, pp_size)
        assert_params_equal(model, hf)
        names = {name for name, _ in model.named_parameters()}
        assert not names & seen, "two stages own the same parameter"
        seen |= names
        assert (model.model.embed_tokens is not None) == (rank == 0)
        assert (
            (model.lm_head is not None) == (model.model.norm is not None) == (rank == pp_size - 1)
        )
    full = get_model(model_config(tiny_llama_dir, hf_config), "cpu")
    assert seen == {name for name, _ in full.named_parameters()}


def test_unknown_architecture_is_rejected():
    with pytest.raises(ValueError) as info:
        get_model_class(["GPT2LMHeadModel"])
    assert str(info.value) == (
        "Model architectures ['GPT2LMHeadModel'] are not supported for now. "
        f"Supported architectures: {ModelRegistry.get_supported_archs()}"
    )
    assert "LlamaForCausalLM" in str(info.value) and "Qwen2ForCausalLM" in str(info.value)


def test_missing_weight_is_named(tiny_llama_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    del tensors["model.norm.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="2 parameters were not found") as info:
        get_model(model_config(str(broken), load_hf_config(tiny_llama_dir)), "cpu")
    assert "model.layers.1.self_attn.qkv_proj.weight" in str(info.value)
    assert "model.norm.weight" in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage header"])
def test_unreadable_safetensors_file_is_named(tiny_llama_dir, tmp_path, damage):
    """A truncated or corrupt safetensors file fails with a ValueError naming the file
    (safetensors' own error does not say which file it was reading)."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    path = broken / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x10" * 64)
    with pytest.raises(ValueError, match="cannot read safetensors file") as info:
        get_model(model_config(str(broken), load_hf_config(tiny_llama_dir)), "cpu")
    assert repr(str(path)) in str(info.value)


def test_unexpected_weight_raises(tiny_llama_dir):
    model = get_model(model_config(tiny_llama_dir, load_hf_config(tiny_llama_dir)), "cpu")
    with pytest.raises(ValueError, match="model.layers.0.mlp.extra_proj.weight"):
        model.load_weights([("model.layers.0.mlp.extra_proj.weight", torch.zeros(2))])
    with pytest.raises(ValueError, match=r"\(6, 64\)"):
        model.load_weights([("model.layers.0.self_attn.k_proj.weight", torch.zeros(6, 64))])


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_dummy_weights_are_deterministic_and_split_independent(fixture, request):
    path = request.getfixturevalue(fixture)
    hf_config = load_hf_config(path)
    cfg = model_config(path, hf_config, load_format="dummy", seed=7)
    full = dict(get_model(cfg, "cpu").named_parameters())
    again = dict(get_model(cfg, "cpu").named_parameters())
    assert all(torch.equal(full[k], again[k]) for k in full)
    for rank in range(2):
        stage = get_model(cfg, "cpu", pp_rank=rank, pp_size=2)
        for name, param in stage.named_parameters():
            want = full.get(name, full.get("model.embed_tokens.weight"))  # tied lm_head
            assert torch.equal(param, want), name
    w = full["model.layers.0.self_attn.qkv_proj.weight"]
    assert w.abs().max() <= 1e-3 and w.std() > 1e-4
    assert torch.equal(full["model.norm.weight"], torch.ones(hf_config.hidden_size))
    other = get_model(model_config(path, hf_config, "dummy", seed=8), "cpu")
    assert not torch.equal(other.model.embed_tokens.weight, full["model.embed_tokens.weight"])
