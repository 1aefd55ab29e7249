"""GGUF metadata that transformers' GGUF reader drops is applied, so the reference is
transformers on the Hugging Face checkpoint the GGUF was written from (same float32
weights):

- RoPE scaling (``{arch}.rope.scaling.type`` and ``.factor``, as llama.cpp's converter
  writes a linear scaling: Gemma 3 4B-27B's global layers scale by 8); a scaling the
  engine does not implement is refused by name;
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


def test_gguf_yarn_rope_scaling_is_refused(tmp_path, tiny_llama_dir):
    """A GGUF with a RoPE scaling type the engine does not implement (YaRN) fails in
    validation with an error naming the metadata key, instead of running unscaled."""
    import tiny_models

    from vllm.config import ModelConfig

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 128}  # fmt: skip
    hf_dir = tiny_models.save_tiny_hf_checkpoint(
        tiny_models.tiny_llama_config(rope_parameters=rope), str(tmp_path / "hf")
    )
    path = tiny_models.write_tiny_gguf(hf_dir, str(tmp_path / "yarn.gguf"), "llama")
    with pytest.raises(ValueError, match=r"llama\.rope\.scaling\.type='yarn' is not supported"):
        ModelConfig(model=path)


@pytest.mark.forked
def test_qwen3_gguf_head_dim_from_key_length(tiny_qwen3_head_dim_32):
    from vllm.transformers_utils.hf_config import load_hf_config

    hf_dir, gguf_path = tiny_qwen3_head_dim_32
    assert load_hf_config(gguf_path).head_dim == 32
    check_gguf_matches_source(hf_dir, gguf_path, PROMPTS, MAX_TOKENS, "qwen3-head-dim-32")
