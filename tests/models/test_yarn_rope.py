"""YaRN RoPE scaling (``rope_type="yarn"``) against transformers on CPU float32.

The tiny models train for an original context of 32 positions scaled by 4: prompts and
outputs run past position 32, where YaRN's interpolated frequencies matter. Phi-3 is not
here: transformers' Phi3Config renames a ``yarn`` type to ``longrope`` (tests/models/
test_families.py covers that).
"""

import pytest

from tests.utils import check_outputs_equal, check_top5_logprobs_within, hf_greedy, vllm_greedy

ORIGINAL = 32
FACTOR = 4.0
MAX_TOKENS = 40
# a 40-token prompt prefills across position 32; the others cross it while decoding
PROMPTS = [
    "Hello world",
    "The capital of France is a city on the river Seine, and its most famous tower is",
    {"prompt_token_ids": [17 + 11 * i for i in range(40)]},
]


def _yarn(theta: float, **fields) -> dict:
    return {"rope_type": "yarn", "rope_theta": theta, "factor": FACTOR,
            "original_max_position_embeddings": ORIGINAL, **fields}  # fmt: skip


def _config(family: str):
    """A tiny config of ``family`` with yarn scaling (each family carries other optional
    fields), max_position_embeddings = the original context (as Qwen2.5's model cards
    add yarn to a config.json)."""
    from tests.models import tiny_models as tm

    short = dict(max_position_embeddings=ORIGINAL)
    if family == "llama":
        return tm.tiny_llama_config(rope_parameters=_yarn(1e4), **short)
    if family == "qwen2":
        return tm.tiny_qwen2_config(rope_parameters=_yarn(1e6, beta_fast=16, beta_slow=2), **short)
    if family == "qwen3":
        return tm.tiny_qwen3_config(rope_parameters=_yarn(1e6, truncate=False), **short)
    if family == "qwen3_moe":
        params = _yarn(1e6, mscale=0.707, mscale_all_dim=1.0)
        return tm.tiny_qwen3_moe_config(rope_parameters=params, **short)
    if family == "mistral":
        return tm.tiny_mistral_config(rope_parameters=_yarn(1e4, attention_factor=1.25), **short)
    if family == "mixtral":  # transformers' yarn needs a head_dim other than None
        params = _yarn(1e6, mscale=1.0, mscale_all_dim=0.8)
        return tm.tiny_mixtral_config(rope_parameters=params, head_dim=16, **short)
    assert family == "gemma3"  # yarn on the global layers only
    rope = {"full_attention": _yarn(1e6),
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    return tm.tiny_gemma3_config(rope_parameters=rope)


YARN_CASES = [
    {},
    {"rope_theta": 1e6, "original_max_position_embeddings": 32768},
    {"beta_fast": 16, "beta_slow": 2},
    {"factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.707},
    {"attention_factor": 1.5},
    {"truncate": False},
    {"factor": 2.0, "truncate": False, "beta_fast": 4, "beta_slow": 4},  # zero-width ramp
    {"factor": None},  # max_position_embeddings / original
    {"factor": 1.0},
]


@pytest.mark.parametrize("head_dim", [16, 128])
@pytest.mark.parametrize("fields", YARN_CASES)
def test_yarn_cos_sin_table_equals_transformers(head_dim, fields):
    """inv_freq and the attention factor equal transformers' yarn ones, and every cos/sin
    row (past the original context too) equals transformers' Llama rotary, bit for bit."""
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from vllm.model_executor.layers.rotary_embedding import (
        RotaryEmbedding,
        compute_inv_freq,
        get_rope_parameters,
    )
    from vllm.model_executor.layers.yarn_rope import yarn_attention_factor

    params = {**_yarn(1e4), **fields}
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=128, rope_parameters=params)  # fmt: skip
    ours = get_rope_parameters(config)
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    torch.testing.assert_close(
        compute_inv_freq(head_dim, ours, max_position=128), hf_inv_freq, rtol=0, atol=0
    )
    assert yarn_attention_factor(ours, 128) == hf_factor
    table = RotaryEmbedding(head_dim, head_dim, 128, ours, num_positions=300).cos_sin_cache
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(300)[None])
    half = head_dim // 2
    expected = torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1)  # [300, head_dim]
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


def test_yarn_default_max_model_len(tmp_path):
    """The default max_model_len is original_max_position_embeddings * factor (upstream's
    rule, e.g. Qwen2.5's 32768 * 4 = 131072), also when max_position_embeddings is larger;
    more is refused naming that limit. Gemma 3's per-layer-type settings keep
    max_position_embeddings, as upstream."""
    from tests.models import tiny_models as tm
    from vllm.config import ModelConfig

    def max_len(config, **kw):
        return ModelConfig(model=str(tmp_path), hf_config=config, **kw).max_model_len

    assert max_len(_config("qwen2")) == 128
    rope = _yarn(1e6, original_max_position_embeddings=32768)
    qwen25 = tm.tiny_qwen2_config(max_position_embeddings=32768, rope_parameters=rope)
    assert max_len(qwen25) == 131072
    assert max_len(tm.tiny_llama_config(rope_parameters=_yarn(1e4))) == 128  # 512 positions
    assert max_len(_config("llama"), max_model_len=100) == 100
    with pytest.raises(
        ValueError, match=r"max_model_len=129 is greater than the model's context limit 128 \(yarn"
    ):
        max_len(_config("llama"), max_model_len=129)
    assert max_len(_config("gemma3")) == 512


@pytest.mark.forked
@pytest.mark.parametrize(
    "family", ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma3"]
)
def test_yarn_family_matches_transformers(family, tmp_path, monkeypatch):
    """Greedy tokens equal transformers' and logprobs agree within 1e-4 for a yarn-scaled
    tiny model, with sequences past the original 32-position context."""
    from tests.models import tiny_models as tm
    from vllm import LLM

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    config = _config(family)
    embed_std = tm.GEMMA3_EMBED_STD if family == "gemma3" else None
    model = tm.save_tiny_hf_checkpoint(config, str(tmp_path / family), seed=31,
                                       embed_std=embed_std)  # fmt: skip
    ref = hf_greedy(model, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 8, f"{family} degenerate output {ids}"
    assert max(len(ids) for ids, _, _ in ref) == MAX_TOKENS  # outputs reach past 32
    llm = LLM(model=model, device="cpu", dtype="float32")
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf", f"{family}-yarn", PROMPTS)
    check_top5_logprobs_within(ref, out, f"{family}-yarn")
    llm.llm_engine.shutdown()
