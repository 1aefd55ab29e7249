"""RoPE scaling stored in a GGUF file's metadata (``{arch}.rope.scaling.type`` and
``.factor``, as llama.cpp's converter writes a linear scaling: Gemma 3 4B-27B's global layers
scale by 8) is applied, not dropped: transformers' GGUF reader ignores these keys, so the
reference is transformers on the Hugging Face checkpoint the GGUF was written from (same
float32 weights). A scaling the engine does not implement is refused by name."""

import pytest

from tests.utils import check_outputs_equal, hf_greedy, vllm_greedy

# token ids: transformers builds Gemma 3's GGUF tokenizer differently from the source
# directory's, so text prompts would not give both runs the same ids
PROMPTS = [
    {"prompt_token_ids": [19556, 905]},
    {"prompt_token_ids": [504, 3575, 282, 4649, 314, 253, 2528, 335, 260, 5246, 35423, 28]},
    {"prompt_token_ids": [17 + 7 * i for i in range(20)]},
    {"prompt_token_ids": [29535]},
]
MAX_TOKENS = 32
LOGPROB_TOL = 1e-4  # float32 on CPU: the same arithmetic as transformers


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


@pytest.mark.forked
@pytest.mark.parametrize("fixture", ["tiny_llama_linear_rope", "tiny_gemma3_linear_rope"])
def test_gguf_linear_rope_scaling_matches_source_checkpoint(fixture, request):
    """Greedy tokens and top-5 logprobs of the GGUF equal transformers' on the source
    checkpoint. Guards: the GGUF's linear RoPE scaling silently dropped (the model then
    rotated with the unscaled frequencies and generated other tokens)."""
    from vllm import LLM

    hf_dir, gguf_path = request.getfixturevalue(fixture)
    ref = hf_greedy(hf_dir, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 8, f"{fixture} degenerate output {ids}"
    llm = LLM(model=gguf_path, device="cpu", dtype="float32")
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    llm.llm_engine.shutdown()
    # ids only: the two tokenizers may decode differently (see PROMPTS)
    check_outputs_equal(
        [(ids, "") for ids, _, _ in ref], [(ids, "") for ids, _, _ in out], "hf-source",
        f"{fixture}-gguf", PROMPTS,
    )  # fmt: skip
    for p, ((_, _, ref_lps), (_, _, lps)) in enumerate(zip(ref, out)):
        for pos, (a, b) in enumerate(zip(ref_lps, lps)):
            for tok in set(a) & set(b):
                assert abs(a[tok] - b[tok]) <= LOGPROB_TOL, (fixture, p, pos, tok)


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
