"""DeepSeek-V2 / V3 pieces without an engine (test_families.py compares both families with
transformers end to end):

- V2's softmax routing (``greedy`` and ``group_limited_greedy``) equals transformers'
  ``DeepseekV2TopkRouter`` on random inputs;
- the MLA softmax scale equals transformers' (``yarn_apply_mscale``) with and without
  YaRN's ``mscale_all_dim``, and the engine's head size and reported scale follow it;
- the rotary part, placed first in each head, rotates as transformers' V2 complex rotation
  and V3's interleaved (up to its evens-then-odds layout) and halves rotations;
- unsupported settings are refused naming the value.
"""

import pytest
import torch
from tiny_models import tiny_deepseek_v2_config, tiny_deepseek_v3_config

from vllm.model_executor.layers.grouped_topk import softmax_group_topk
from vllm.model_executor.models.deepseek_mla import (
    mla_head_size,
    mla_rotary_emb,
    mla_softmax_scale,
)
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

V2_ROUTERS = [
    dict(topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5),
    dict(topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0),
    dict(topk_method="group_limited_greedy", n_group=8, topk_group=3, routed_scaling_factor=16.0,
         n_routed_experts=16, num_experts_per_tok=6),
]  # fmt: skip


@pytest.mark.parametrize("layout", V2_ROUTERS)
def test_softmax_routing_matches_transformers_router(layout):
    """Same experts per token and the same weights as DeepseekV2TopkRouter on 256 random
    hidden states (each row ordered by expert id: both use topk's unsorted order)."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    config = tiny_deepseek_v2_config(**layout)
    gen = torch.Generator().manual_seed(0)
    router = DeepseekV2TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(0.3 * torch.randn(router.weight.shape, generator=gen))
    x = torch.randn(256, config.hidden_size, generator=gen)  # [T, H]
    grouped = layout["topk_method"] == "group_limited_greedy"
    with torch.no_grad():
        _, hf_weights, hf_ids = router(x)
        logits = torch.nn.functional.linear(x, router.weight)  # [T, E]
        weights, ids = softmax_group_topk(
            logits, config.num_experts_per_tok, config.n_group if grouped else None,
            config.topk_group if grouped else None, config.routed_scaling_factor, torch.float32,
        )  # fmt: skip
    hf_ids, hf_order = hf_ids.sort(dim=-1)
    ids, order = ids.sort(dim=-1)
    assert torch.equal(ids, hf_ids)
    assert torch.equal(weights.gather(1, order), hf_weights.gather(1, hf_order))


@pytest.mark.parametrize(
    "version, rope",
    [
        ("v2", None),  # the tiny V2 config: yarn, mscale = mscale_all_dim = 0.707
        (
            "v3",
            {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 40.0,
                "original_max_position_embeddings": 128,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        ),  # fmt: skip
        ("v3", None),  # the tiny V3 config: no scaling
    ],
)
def test_softmax_scale_matches_transformers(version, rope):
    """The MLA softmax scale equals transformers' attention ``scaling`` exactly: 1 /
    sqrt(qk_nope + qk_rope), times yarn's mscale(factor, mscale_all_dim) squared."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    build = tiny_deepseek_v2_config if version == "v2" else tiny_deepseek_v3_config
    config = build() if rope is None else build(rope_parameters=rope)
    attention = DeepseekV2Attention if version == "v2" else DeepseekV3Attention
    expected = attention(config, layer_idx=0).scaling
    assert mla_softmax_scale(config) == expected
    plain = 24**-0.5  # qk head 16 + 8
    assert (expected == plain) == (rope is None and version == "v3")


def test_engine_head_size_and_scale(tiny_deepseek_v2_dir):
    """The engine sizes heads and the KV cache at max(qk head, v head) = 24, not the
    config's head_dim (transformers sets it to qk_rope_head_dim, 8), and reports the MLA
    scale to the backends."""
    from vllm.config import ModelConfig
    from vllm.model_executor.models import attention_fields

    model_config = ModelConfig(model=tiny_deepseek_v2_dir)
    config = model_config.hf_config
    assert config.head_dim == 8 and model_config.head_size == mla_head_size(config) == 24
    assert attention_fields(config) == {"scale": mla_softmax_scale(config)}


def test_enable_lora_is_refused_before_the_engine_starts(tiny_deepseek_v2_dir, tiny_llama_dir):
    """No DeepSeek layer takes a LoRA adapter here: --enable-lora is refused when the
    engine config is made (it used to start, and fail at each adapter's load)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=tiny_deepseek_v2_dir, device="cpu", enable_lora=True)
    with pytest.raises(ValueError, match="DeepseekV2ForCausalLM has no layer LoRA adapters"):
        args.create_engine_config()
    assert EngineArgs(model=tiny_deepseek_v2_dir, device="cpu").create_engine_config()
    lora = EngineArgs(model=tiny_llama_dir, device="cpu", enable_lora=True)
    assert lora.create_engine_config().lora_config is not None


def _hf_rotary(version: str, config, q, k, positions):
    """transformers' rotation of q [1, H, T, rope] and k [1, 1, T, rope]."""
    if version == "v2":
        from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m

        freqs = m.DeepseekV2RotaryEmbedding(config)(q, positions[None])
        return m.apply_rotary_emb(q, k, freqs)
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    cos, sin = m.DeepseekV3RotaryEmbedding(config)(q, positions[None])
    if config.rope_interleave:
        return m.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    return m.apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("version, interleave", [("v2", True), ("v3", True), ("v3", False)])
def test_rotary_part_matches_transformers(version, interleave):
    """The first qk_rope_head_dim channels of each engine head rotate as transformers
    rotates q_pe and k_pe: V3's halves and interleaved rotations exactly (the latter up to
    its evens-then-odds layout, a permutation of both queries and keys, which leaves every
    score unchanged), V2's complex one within float32 rounding (``torch.polar`` and the
    complex product round the last bit differently); the other channels pass through."""
    if version == "v2":
        config = tiny_deepseek_v2_config()
    else:
        config = tiny_deepseek_v3_config(rope_interleave=interleave)
    rope, size, heads = config.qk_rope_head_dim, mla_head_size(config), 4
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 2, 7, 100, 300, 511])
    t = len(positions)
    q = torch.randn(t, heads, size, generator=gen)  # [T, H, head_size]
    k = torch.randn(t, 1, size, generator=gen).expand(t, heads, size)  # shared rotary key
    rotary = mla_rotary_emb(config, 512, interleaved=interleave)
    out_q, out_k = rotary.forward_native(positions, q.reshape(t, -1), k.reshape(t, -1))
    out_q, out_k = out_q.view(t, heads, size), out_k.view(t, heads, size)
    hf_q, hf_k = _hf_rotary(version, config, q[None, ..., :rope].transpose(1, 2),
                            k[None, :, :1, :rope].transpose(1, 2), positions)  # fmt: skip
    hf_q, hf_k = hf_q[0].transpose(0, 1), hf_k[0].transpose(0, 1)  # [T, H or 1, rope]
    if version == "v3" and interleave:  # evens then odds -> pairs in place
        order = torch.stack([torch.arange(rope // 2), torch.arange(rope // 2) + rope // 2], -1)
        hf_q, hf_k = hf_q[..., order.flatten()], hf_k[..., order.flatten()]
    tol = 5e-7 if version == "v2" else 0.0
    torch.testing.assert_close(out_q[..., :rope], hf_q, rtol=0, atol=tol)
    torch.testing.assert_close(out_k[..., :rope], hf_k.expand(t, heads, rope), rtol=0, atol=tol)
    assert torch.equal(out_q[..., rope:], q[..., rope:])


@pytest.mark.parametrize(
    "cls, field, value, words",
    [
        (DeepseekV2ForCausalLM, "scoring_func", "sigmoid", "scoring_func='sigmoid' is not"),
        (DeepseekV2ForCausalLM, "topk_method", "noaux_tc", "topk_method='noaux_tc' is not"),
        (DeepseekV2ForCausalLM, "norm_topk_prob", True, "norm_topk_prob=True is not"),
        (DeepseekV2ForCausalLM, "n_group", 3, "n_group=3 must be positive and divide"),
        (DeepseekV2ForCausalLM, "num_key_value_heads", 2, "num_key_value_heads=2 is not"),
        (DeepseekV2ForCausalLM, "moe_layer_freq", 2, "moe_layer_freq=2 is not supported"),
        (DeepseekV2ForCausalLM, "mlp_bias", True, "mlp_bias=True is not supported"),
        (DeepseekV3ForCausalLM, "scoring_func", "softmax", "scoring_func='softmax' is not"),
        (DeepseekV3ForCausalLM, "topk_method", "greedy", "topk_method='greedy' is not"),
        (DeepseekV3ForCausalLM, "topk_group", 5, r"topk_group=5 must be in \[1, n_group=4\]"),
        (DeepseekV3ForCausalLM, "n_shared_experts", 0, "n_shared_experts=0 is not supported"),
    ],
)
def test_unsupported_settings_are_refused(cls, field, value, words):
    """A setting the engine does not implement is refused by name, before building."""
    build = tiny_deepseek_v2_config if cls is DeepseekV2ForCausalLM else tiny_deepseek_v3_config
    config = build()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=words):
        cls(config)
