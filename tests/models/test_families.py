"""Every supported family against Hugging Face transformers on tiny random checkpoints.

CPU float32, so every comparison is exact (docs/design.md): greedy tokens of 4 prompts x 32
tokens equal transformers' ``generate`` batched and one prompt at a time, logprobs agree
within 1e-4, PP=2 and n-gram speculation give the same tokens. Each tiny model must produce
several distinct tokens per prompt for the comparison to mean anything.
"""

import pytest

from tests.utils import check_outputs_equal, check_top5_logprobs_within, hf_greedy, vllm_greedy

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "Paris"]
NGRAM_PROMPTS = [
    "red green blue, red green blue, red green blue, red green",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,",
]
MAX_TOKENS = 32

# Gemma 2's and 3's and OLMo 3's sliding layers attend over 8 tokens: prompts longer than
# the window, so the windowed prefill (not only decode) differs from full attention
WINDOW_PROMPTS = [
    "Hello world",
    "The capital of France is a city on the river Seine, and its most famous tower is",
    "a b c d e f g h i j k l m n o p",
    "Paris",
]
HF_DIRS = [
    "tiny_qwen3_dir",
    "tiny_mistral_dir",
    "tiny_phi3_dir",
    "tiny_phi4_mini_dir",
    "tiny_qwen2_moe_dir",
    "tiny_qwen3_moe_dir",
    "tiny_mixtral_dir",
    "tiny_gemma2_dir",
    "tiny_gemma3_dir",
    "tiny_granite_dir",
    "tiny_smollm3_dir",
    "tiny_olmo2_dir",
    "tiny_olmo3_dir",
    "tiny_glm4_dir",
    "tiny_glm4_moe_dir",
    "tiny_deepseek_v2_dir",
    "tiny_deepseek_v3_dir",
]
PROMPTS_OF = {
    "tiny_gemma2_dir": WINDOW_PROMPTS,
    "tiny_gemma2_gguf": WINDOW_PROMPTS,
    "tiny_gemma3_dir": WINDOW_PROMPTS,
    "tiny_gemma3_gguf": WINDOW_PROMPTS,
    "tiny_olmo3_dir": WINDOW_PROMPTS,
}
GGUF_FILES = ["tiny_qwen3_gguf", "tiny_gemma2_gguf", "tiny_gemma3_gguf"]


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _engine(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", **kw)


@pytest.mark.forked
@pytest.mark.parametrize("fixture", HF_DIRS + GGUF_FILES)
def test_family_matches_transformers(fixture, request):
    """Greedy tokens batched and alone equal transformers'; logprobs within 1e-4."""
    model = request.getfixturevalue(fixture)
    prompts = PROMPTS_OF.get(fixture, PROMPTS)
    ref = hf_greedy(model, prompts, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 8, f"{fixture} degenerate output {ids}"
    llm = _engine(model)
    batched = vllm_greedy(llm, prompts, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, batched, "hf", fixture, prompts)
    check_top5_logprobs_within(ref, batched, fixture)
    alone = [vllm_greedy(llm, [p], MAX_TOKENS)[0] for p in prompts]
    check_outputs_equal(ref, alone, "hf", fixture + "-alone", prompts)
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_gemma3_attn_logit_softcapping_is_ignored(tiny_gemma3_softcap_dir):
    """A Gemma 3 config with ``attn_logit_softcapping`` set gives transformers' tokens and
    logprobs: transformers' Gemma 3 never caps attention scores, so an engine that applied
    the config's cap would differ from it."""
    ref = hf_greedy(tiny_gemma3_softcap_dir, WINDOW_PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 8, f"degenerate output {ids}"
    llm = _engine(tiny_gemma3_softcap_dir)
    out = vllm_greedy(llm, WINDOW_PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf", "gemma3-softcap", WINDOW_PROMPTS)
    check_top5_logprobs_within(ref, out, "gemma3-softcap")
    llm.llm_engine.shutdown()


@pytest.mark.forked
@pytest.mark.parametrize("fixture", HF_DIRS)
def test_family_pp2_and_ngram_equal_plain(fixture, request):
    """PP=2 (one layer per stage) gives transformers' tokens (the plain run's: equal to
    PP=1, test above); n-gram speculation gives PP=2's tokens, on prompts with repeats too;
    the family as its own draft gives transformers' tokens. Each engine starts once."""
    model = request.getfixturevalue(fixture)
    base = PROMPTS_OF.get(fixture, PROMPTS)
    ref = hf_greedy(model, base, MAX_TOKENS)
    # a random model seldom continues the prompt's spans; its own repeats give proposals too
    prompts = base + NGRAM_PROMPTS
    llm = _engine(model, pipeline_parallel_size=2)
    pp2 = vllm_greedy(llm, prompts, MAX_TOKENS)
    check_outputs_equal(ref, pp2[: len(base)], "hf", "pp2", base)
    llm.llm_engine.shutdown()
    del llm
    llm = _engine(
        model, speculative_model="[ngram]", num_speculative_tokens=3, ngram_prompt_lookup_max=3
    )
    spec = vllm_greedy(llm, prompts, MAX_TOKENS)
    check_outputs_equal(pp2, spec, "pp2", "ngram", prompts)
    assert llm.llm_engine.spec_decode_metrics()["num_draft_tokens"] > 0
    llm.llm_engine.shutdown()
    del llm
    # the family as the draft model: draft = target in float32 accepts every proposal
    llm = _engine(model, speculative_model=model, num_speculative_tokens=3)
    spec = vllm_greedy(llm, base, MAX_TOKENS)
    check_outputs_equal(ref, spec, "hf", "draft = target", base)
    metrics = llm.llm_engine.spec_decode_metrics()
    assert metrics["num_draft_tokens"] > 0
    assert metrics["num_accepted_tokens"] == metrics["num_draft_tokens"], metrics
    llm.llm_engine.shutdown()


def test_uniform_window_caps_max_model_len(tiny_mistral_dir):
    """Mistral's sliding window (256) caps the default max_model_len; asking for more is a
    clear error (windowed attention equals full attention only inside the window)."""
    from vllm.config import ModelConfig

    assert ModelConfig(model=tiny_mistral_dir).max_model_len == 256
    with pytest.raises(ValueError, match="max_model_len=300 is greater than .*sliding_window=256"):
        ModelConfig(model=tiny_mistral_dir, max_model_len=300)


@pytest.mark.forked
def test_long_max_model_len_keeps_longrope_scaling(tiny_phi3_dir, monkeypatch):
    """max_model_len above max_position_embeddings (VLLM_ALLOW_LONG_MAX_MODEL_LEN) leaves
    the model's RoPE as trained: Phi-3's LongRoPE attention factor comes from the config's
    max_position_embeddings, so rewriting that to max_model_len changed the outputs of
    prompts far inside the original context. Tokens and logprobs equal transformers'."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    ref = hf_greedy(tiny_phi3_dir, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 8, f"degenerate output {ids}"
    llm = _engine(tiny_phi3_dir, max_model_len=2048)
    config = llm.llm_engine.model_config
    assert config.max_model_len == 2048 and config.hf_config.max_position_embeddings == 512
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf", "phi3-max_model_len-2048", PROMPTS)
    check_top5_logprobs_within(ref, out, "phi3-max_model_len-2048")
    llm.llm_engine.shutdown()


@pytest.mark.parametrize("family, rotary_dim", [("phi3", 16), ("phi4_mini", 12)])
def test_longrope_cache_rows_equal_transformers(family, rotary_dim):
    """Each cos/sin row equals transformers' Phi-3 rotary for a forward whose longest
    position is that row: short factors below the original context (128), long ones from it,
    times the attention factor; with a partial rotary (Phi-4-mini's shape: 12 of 16
    channels) the table is rotary_dim wide, one factor per rotated pair."""
    import torch
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from tests.models import tiny_models
    from vllm.model_executor.layers.rotary_embedding import (
        RotaryEmbedding,
        get_rope_parameters,
        partial_rotary_dim,
    )

    config = getattr(tiny_models, f"tiny_{family}_config")()
    assert partial_rotary_dim(config, 16) == rotary_dim
    ours = RotaryEmbedding(16, rotary_dim, 512, get_rope_parameters(config)).cos_sin_cache
    hf = Phi3RotaryEmbedding(config)
    assert hf.attention_scaling > 1.0
    half = rotary_dim // 2
    for pos in (0, 5, 127, 128, 300, 511):
        cos, sin = hf(torch.zeros(1), torch.arange(pos + 1)[None])  # [1, pos + 1, rotary_dim]
        torch.testing.assert_close(
            ours[pos], torch.cat((cos[0, -1, :half], sin[0, -1, :half])), rtol=0, atol=0
        )


def test_freq_factors_reproduce_llama3_inv_freq():
    """Default inverse frequencies divided by llama.cpp's rope_freqs for a llama3 scaling
    equal transformers' llama3 ones (within float32 rounding of the blended band), and a
    factor list of the wrong length is refused."""
    import torch
    from tiny_models import llama3_rope_freqs, tiny_llama31_config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from vllm.model_executor.layers.rotary_embedding import compute_inv_freq, get_rope_parameters

    config = tiny_llama31_config()
    factors = llama3_rope_freqs(get_rope_parameters(config), 16).tolist()
    assert factors[0] == 1.0 and factors[-1] == 8.0 and 1.0 < factors[1] < 8.0
    params = {"rope_type": "default", "rope_theta": 10000.0, "freq_factors": factors}
    hf, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")  # [8]
    torch.testing.assert_close(compute_inv_freq(16, params), hf, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match=r"freq_factors has 3 entries, expected .* = 8"):
        compute_inv_freq(16, {**params, "freq_factors": [1.0, 2.0, 3.0]})


def test_unsupported_combinations_are_refused(tmp_path, tiny_gemma3_dir):
    """Validation refuses what the README's model table marks "no": a GGUF file of an
    architecture without GGUF support (Mistral here), and an architecture outside the
    registry (Gemma 3's multimodal class), naming the supported ones."""
    import tiny_models

    from vllm.config import ModelConfig

    gguf = tmp_path / "mistral.gguf"
    gguf.write_bytes(b"")  # the config is given: the file is only recognised by its name
    with pytest.raises(ValueError, match=r"MistralForCausalLM is not supported from a GGUF"):
        ModelConfig(model=str(gguf), hf_config=tiny_models.tiny_mistral_config())
    config = tiny_models.tiny_gemma3_config()
    config.architectures = ["Gemma3ForConditionalGeneration"]
    with pytest.raises(ValueError, match=r"Supported architectures: .*'Gemma3ForCausalLM'"):
        ModelConfig(model=tiny_gemma3_dir, hf_config=config)
    assert ModelConfig(model=tiny_gemma3_dir).max_model_len == 512  # no uniform-window cap


@pytest.mark.forked
def test_gemma3_cached_prefix_longer_than_window(tiny_gemma3_dir):
    """Prefix caching with sliding layers: a prompt whose first 12 tokens (three 4-token
    blocks, longer than the 8-token window) are cached by an earlier request attends through
    the paged cache with the window and gives transformers' tokens and logprobs."""
    prefix = [17 + 7 * i for i in range(14)]
    first = {"prompt_token_ids": prefix + [401, 402, 403, 404, 405]}
    second = {"prompt_token_ids": prefix + [611, 612, 613]}
    ref = hf_greedy(tiny_gemma3_dir, [second], MAX_TOKENS)
    assert len(set(ref[0][0])) >= 8, ref[0][0]
    llm = _engine(tiny_gemma3_dir, block_size=4, enable_prefix_caching=True)
    vllm_greedy(llm, [first], MAX_TOKENS)
    from vllm import SamplingParams

    (out,) = llm.generate([second], SamplingParams(temperature=0.0, max_tokens=1),
                          use_tqdm=False)  # fmt: skip
    assert out.num_cached_tokens == 12
    got = vllm_greedy(llm, [second], MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, got, "hf", "gemma3-prefix-cached", [second])
    check_top5_logprobs_within(ref, got, "gemma3-prefix-cached")
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_qwen2_window_flag_without_windowed_layers_matches_transformers(tmp_path):
    """A Qwen2 config with use_sliding_window=True whose max_window_layers covers every
    layer runs full attention in transformers (its layer_types are all full_attention):
    the engine accepts it (it refused every use_sliding_window=True) and matches
    transformers past the 4-token window."""
    from tests.models import tiny_models

    config = tiny_models.tiny_qwen2_config(
        use_sliding_window=True, sliding_window=4, max_window_layers=2
    )
    assert config.layer_types == ["full_attention", "full_attention"]
    model = tiny_models.save_tiny_hf_checkpoint(config, str(tmp_path / "qwen2"), seed=5)
    ref = hf_greedy(model, PROMPTS, 16)
    for ids, _, _ in ref:
        assert len(set(ids)) >= 6, f"degenerate output {ids}"
    llm = _engine(model)
    check_outputs_equal(ref, vllm_greedy(llm, PROMPTS, 16), "hf", "qwen2", PROMPTS)
    llm.llm_engine.shutdown()
