"""GGUF metadata that transformers' GGUF reader drops is applied, so the reference is
transformers on the Hugging Face checkpoint the GGUF was written from (same float32
weights):

- RoPE scaling (``{arch}.rope.scaling.type`` and ``.factor``, as llama.cpp's converter
  writes a linear or YaRN scaling: Gemma 3 4B-27B's global layers scale by 8, Qwen2.5
  documents YaRN for long contexts); a scaling the engine does not implement is refused
  by name;
- the head size (``{arch}.attention.key_length``), which the reader does not map for
  qwen3: it kept Qwen3Config's default 128, and a qwen3 GGUF with another head size
  failed to load ("the parameter expects (128,)")."""

import pytest

from tests.utils import check_gguf_matches_source

# token ids: transformers builds Gemma 3's GGUF tokenizer differently from the source
# directory's, so text prompts would not give both runs the same ids
PROMPTS = [
    {"prompt_token_ids": [19556, 905]},
    {"prompt_token_ids": [504, 3575, 282, 4649, 314, 253, 2528, 335, 260, 5246, 35423, 28]},
    {"prompt_token_ids": [17 + 7 * i for i in range(20)]},
    {"prompt_token_ids": [29535]},
]
MAX_TOKENS = 32


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


@pytest.mark.forked
@pytest.mark.parametrize("fixture", ["tiny_llama_linear_rope", "tiny_gemma3_linear_rope"])
def test_gguf_linear_rope_scaling_matches_source_checkpoint(fixture, request):
    """Greedy tokens and top-5 logprobs of the GGUF equal transformers' on the source
    checkpoint. Guards: the GGUF's linear RoPE scaling silently dropped (the model then
    rotated with the unscaled frequencies and generated other tokens)."""
    hf_dir, gguf_path = request.getfixturevalue(fixture)
    check_gguf_matches_source(hf_dir, gguf_path, PROMPTS, MAX_TOKENS, fixture, min_distinct=8)


@pytest.mark.forked
@pytest.mark.parametrize(
    "fixture", ["tiny_llama_yarn_rope", "tiny_qwen2_yarn_rope", "tiny_gemma3_yarn_rope"]
)
def test_gguf_yarn_rope_scaling_matches_source_checkpoint(fixture, request):
    """A GGUF whose metadata holds YaRN scaling (type, factor, original_context_length, as
    llama.cpp's converter writes it; 32 original positions, which the sequences pass) gives
    transformers' tokens and top-5 logprobs on the source checkpoint. It was refused."""
    hf_dir, gguf_path = request.getfixturevalue(fixture)
    check_gguf_matches_source(hf_dir, gguf_path, PROMPTS, MAX_TOKENS, fixture, min_distinct=8)


def test_gguf_yarn_rope_scaling_reads_llama_cpp_keys():
    """The yarn keys of a GGUF map to transformers' rope parameters (beta_fast / beta_slow
    from yarn_beta_fast / yarn_beta_slow, no original context: the file's context length);
    keys whose llama.cpp meaning is not implemented (a DeepSeek-style
    yarn_log_multiplier) are refused by name instead of running without them."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.rotary_embedding import set_gguf_rope_scaling

    scaling = {"key": "qwen2.rope.scaling.type", "type": "yarn", "factor": 4,
               "original_context_length": None, "yarn_beta_fast": 16.0,
               "yarn_beta_slow": 2.0, "other_keys": []}  # fmt: skip
    config = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    set_gguf_rope_scaling(config, scaling)
    assert config.rope_parameters == {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                      "beta_fast": 16.0, "beta_slow": 2.0}  # fmt: skip
    scaling["other_keys"] = ["qwen2.rope.scaling.yarn_log_multiplier"]
    with pytest.raises(ValueError, match=r"with \['qwen2\.rope\.scaling\.yarn_log_multiplier'\]"):
        set_gguf_rope_scaling(config, scaling)
    with pytest.raises(ValueError, match=r"rope\.scaling\.type='longrope' is not supported"):
        set_gguf_rope_scaling(config, {**scaling, "type": "longrope"})


@pytest.mark.forked
def test_qwen3_gguf_head_dim_from_key_length(tiny_qwen3_head_dim_32):
    from vllm.transformers_utils.hf_config import load_hf_config

    hf_dir, gguf_path = tiny_qwen3_head_dim_32
    assert load_hf_config(gguf_path).head_dim == 32
    check_gguf_matches_source(hf_dir, gguf_path, PROMPTS, MAX_TOKENS, "qwen3-head-dim-32")


def test_gguf_rope_scaling_lists_yarn_keys(tmp_path):
    """The reader keeps a file's yarn beta keys and names its other rope.scaling keys
    (``finetuned``, informational, excepted) for the refusal above."""
    import gguf

    from vllm.model_executor.model_loader.gguf_loader import gguf_rope_scaling

    path = str(tmp_path / "yarn_keys.gguf")
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(32)
    writer.add_rope_scaling_yarn_beta_fast(16.0)
    writer.add_rope_scaling_finetuned(True)
    writer.add_rope_scaling_yarn_log_mul(0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scaling = gguf_rope_scaling(gguf.GGUFReader(path))
    assert scaling == {
        "key": "qwen2.rope.scaling.type",
        "type": "yarn",
        "factor": 4.0,
        "original_context_length": 32,
        "yarn_beta_fast": 16.0,
        "yarn_beta_slow": None,
        "other_keys": ["qwen2.rope.scaling.yarn_log_multiplier"],
    }
