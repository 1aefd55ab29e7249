"""GLM-4 / GLM-4.5 pieces without an engine (test_families.py compares both families with
transformers end to end):

- the group-limited sigmoid routing equals transformers' ``Glm4MoeTopkRouter`` (indices
  exactly, weights within 1e-6) on random inputs, for grouped and ungrouped layouts;
- the tiny GLM-4.5 checkpoint's correction bias changes transformers' greedy tokens, so the
  family test would fail for an engine that ignored it;
- the interleaved partial rotary equals transformers' GLM-4 ``apply_rotary_pos_emb``;
- unsupported router settings are refused naming the value.
"""

import pytest
import torch
from tiny_models import tiny_glm4_config, tiny_glm4_moe_config

from vllm.model_executor.layers.grouped_topk import grouped_topk
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from vllm.model_executor.models.glm4_moe import Glm4MoeForCausalLM

ROUTER_LAYOUTS = [
    dict(n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5),
    dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0),
    dict(n_group=8, topk_group=3, norm_topk_prob=False, routed_scaling_factor=1.5,
         n_routed_experts=16, num_experts_per_tok=4),
]  # fmt: skip


def _hf_router(config, seed: int):
    """transformers' Glm4MoeTopkRouter of ``config`` with a random weight and bias."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    gen = torch.Generator().manual_seed(seed)
    router = Glm4MoeTopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(0.3 * torch.randn(router.weight.shape, generator=gen))
        bias = router.e_score_correction_bias
        bias.copy_(0.5 * torch.randn(bias.shape, generator=gen))
    return router, gen


def _ours(config, router, x: torch.Tensor, bias: torch.Tensor):
    logits = torch.nn.functional.linear(x, router.weight)  # [T, E] float32
    return grouped_topk(logits, bias, config.num_experts_per_tok, config.n_group,
                        config.topk_group, config.norm_topk_prob,
                        config.routed_scaling_factor, torch.float32)  # fmt: skip


def _sorted(weights: torch.Tensor, ids: torch.Tensor):
    """(weights, ids) [T, k] with each row ordered by expert id."""
    ids, order = ids.sort(dim=-1)
    return weights.gather(1, order), ids


@pytest.mark.parametrize("layout", ROUTER_LAYOUTS)
def test_grouped_topk_matches_transformers_router(layout):
    """Same experts per token and weights within 1e-6 as Glm4MoeTopkRouter on 256 random
    hidden states; with the bias left out the chosen experts differ (the bias matters)."""
    config = tiny_glm4_moe_config(**layout)
    router, gen = _hf_router(config, seed=0)
    x = torch.randn(256, config.hidden_size, generator=gen)  # [T, H]
    with torch.no_grad():
        _, hf_weights, hf_ids = router(x)
        weights, ids = _ours(config, router, x, router.e_score_correction_bias)
        _, unbiased_ids = _ours(config, router, x, torch.zeros_like(router.e_score_correction_bias))
    hf_weights, hf_ids = _sorted(hf_weights, hf_ids)
    weights, ids = _sorted(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=1e-6)
    assert not torch.equal(unbiased_ids.sort(dim=-1)[0], hf_ids)


@pytest.mark.forked
def test_correction_bias_changes_greedy_tokens(tiny_glm4_moe_dir):
    """transformers' greedy tokens of the tiny GLM-4.5 checkpoint change when its
    ``e_score_correction_bias`` is zeroed: an engine that ignored the bias would fail the
    family test (test_families.py compares with the biased model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_glm4_moe_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_glm4_moe_dir, dtype=torch.float32).eval()
    biases = [b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    assert len(biases) == 2 and all(b.abs().max() > 0 for b in biases)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=2, eos_token_id=None)
    with torch.no_grad():
        biased = model.generate(ids, **kw)
        for b in biases:
            b.zero_()
        unbiased = model.generate(ids, **kw)
    assert not torch.equal(biased, unbiased)


def test_interleaved_partial_rotary_matches_transformers():
    """GLM-4's rotation (pairs of adjacent channels, the first half of each head) equals
    transformers' Glm4 ``apply_rotary_pos_emb`` bit for bit; the halves rotation differs."""
    from transformers.models.glm4.modeling_glm4 import Glm4RotaryEmbedding, apply_rotary_pos_emb

    config = tiny_glm4_config()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 7, 16, generator=gen)  # [B, heads, T, head_dim]
    k = torch.randn(1, 2, 7, 16, generator=gen)
    positions = torch.tensor([0, 1, 2, 5, 100, 300, 511])
    cos, sin = Glm4RotaryEmbedding(config)(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    flat = lambda t: t.transpose(1, 2).reshape(7, -1)  # noqa: E731 [T, heads * head_dim]
    params = get_rope_parameters(config)
    rope = RotaryEmbedding(16, 8, 512, params, interleaved=True)
    out_q, out_k = rope.forward_native(positions, flat(q), flat(k))
    assert torch.equal(out_q, flat(ref_q)) and torch.equal(out_k, flat(ref_k))
    halves_q, _ = RotaryEmbedding(16, 8, 512, params).forward_native(positions, flat(q), flat(k))
    assert not torch.allclose(halves_q, flat(ref_q))


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("scoring_func", "softmax", "scoring_func='softmax' is not supported"),
        ("topk_method", "greedy", "topk_method='greedy' is not supported"),
        ("n_group", 3, "n_group=3 must be positive and divide n_routed_experts=8"),
        ("topk_group", 5, r"topk_group=5 must be in \[1, n_group=4\]"),
        ("n_shared_experts", 0, "n_shared_experts=0 is not supported"),
    ],
)
def test_unsupported_router_settings_are_refused(field, value, words):
    """A router setting the engine does not implement is refused by name, before building."""
    config = tiny_glm4_moe_config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=words):
        Glm4MoeForCausalLM(config)
