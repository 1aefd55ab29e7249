"""The default max_model_len of a model whose RoPE scaling stretches its positions.

Upstream derives the context limit as max_position_embeddings times the factor of a linear
RoPE scaling (the config keeps the pre-scaling context); llama3 and longrope scalings, and
Gemma 3 configs, already count theirs. A limit read from max_position_embeddings alone made
such models default to a fraction of their context and refused an explicit max_model_len
within it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN was set.
"""

import pytest

from tests.utils import check_outputs_equal, hf_greedy, vllm_greedy

# tiny_llama_linear_rope: max_position_embeddings 512, linear RoPE factor 4
POSITIONS, FACTOR = 512, 4
# token ids of a prompt that runs past max_position_embeddings (varied, inside the vocab)
LONG_PROMPT = {"prompt_token_ids": [10 + (i * 7919) % 40000 for i in range(600)]}
MAX_TOKENS = 8


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)


def test_linear_rope_factor_scales_the_default_max_model_len(
    tiny_llama_linear_rope, tiny_llama_dir
):
    """HF directory and GGUF file alike default to 512 x 4 = 2048 tokens, accept that much
    without VLLM_ALLOW_LONG_MAX_MODEL_LEN and refuse one token more, naming the limit and
    its parts; an unscaled model keeps its max_position_embeddings."""
    from vllm.config import ModelConfig

    limit = POSITIONS * FACTOR
    for model in tiny_llama_linear_rope:
        assert ModelConfig(model=model).max_model_len == limit, model
        assert ModelConfig(model=model, max_model_len=limit).max_model_len == limit
        with pytest.raises(
            ValueError,
            match=rf"max_model_len={limit + 1} is greater than the model's context limit "
            rf"{limit} \(max_position_embeddings={POSITIONS} x RoPE factor {FACTOR}\); "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows it",
        ):
            ModelConfig(model=model, max_model_len=limit + 1)
    assert ModelConfig(model=tiny_llama_dir).max_model_len == POSITIONS


def test_gemma3_linear_rope_keeps_max_position_embeddings(tiny_gemma3_linear_rope):
    """Gemma 3's max_position_embeddings already counts its global layers' scaling (as
    upstream reads it): the default stays the config's value."""
    from transformers import AutoConfig

    from vllm.config import ModelConfig

    hf_dir, _ = tiny_gemma3_linear_rope
    positions = AutoConfig.from_pretrained(hf_dir).max_position_embeddings
    assert ModelConfig(model=hf_dir).max_model_len == positions


@pytest.mark.forked
def test_linear_rope_generates_past_max_position_embeddings(tiny_llama_linear_rope):
    """With the default max_model_len a 600-token prompt (past the 512 positions of the
    config) generates the tokens transformers generates, logprobs within 1e-4."""
    from vllm import LLM

    hf_dir, _ = tiny_llama_linear_rope
    ref = hf_greedy(hf_dir, [LONG_PROMPT], MAX_TOKENS)
    assert len(set(ref[0][0])) >= 4, f"degenerate output {ref[0][0]}"  # docs/design.md
    llm = LLM(model=hf_dir, device="cpu", dtype="float32")
    assert llm.llm_engine.model_config.max_model_len == POSITIONS * FACTOR
    out = vllm_greedy(llm, [LONG_PROMPT], MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf", "vllm", [LONG_PROMPT])
    for pos, (a, b) in enumerate(zip(ref[0][2], out[0][2])):
        for tok in set(a) & set(b):
            assert abs(a[tok] - b[tok]) <= 1e-4, f"pos {pos} token {tok}: {a[tok]} vs {b[tok]}"
    llm.llm_engine.shutdown()
