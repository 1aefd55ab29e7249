"""Granite's multipliers and SmolLM3's NoPE layers on the paths the CPU engine tests do not
take (test_families.py compares both families with transformers end to end):

- the one-row GEMV path (``forward_small_batch``, CUDA only) applies Granite's residual
  multiplier where the eager forward does: run here with a torch stand-in for the kernel
  module (``vllm.kernels.gemv``'s contract, same formulas), bit-exact to the eager layer;
- Granite's logits in the model's dtype (a decode-loop graph's ``float32=False``) are the
  float32 logits before their conversion, and divided as transformers divides them;
- the softmax scale reaches the backend's spec, and a layer whose scale the spec does not
  carry is refused when the model runner loads it;
- SmolLM3 layers get a rotary embedding exactly where transformers applies RoPE.
"""

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_granite_config, tiny_smollm3_config

from vllm.attention.backends.abstract import AttentionSpec
from vllm.attention.layer import check_layers_match_spec
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models import attention_fields
from vllm.model_executor.models.granite import GraniteDecoderLayer, GraniteForCausalLM
from vllm.model_executor.models.smollm3 import SmolLM3ForCausalLM, smollm3_rope_layers


class TorchGemv:
    """The two entry points of ``vllm.kernels.gemv`` as the torch ops they stand for
    (RMSNorm.forward_native's formula, ``F.linear``, SiLU-and-mul)."""

    @staticmethod
    def linear(x, weight, bias=None, weight_scale=None):
        assert weight_scale is None
        return F.linear(x, weight, bias)

    @staticmethod
    def norm_linear(x, residual, norm_weight, eps, weight, bias=None, silu_mul=False,
                    weight_scale=None):  # fmt: skip
        assert weight_scale is None
        s = x if residual is None else residual + x
        h = s.float()
        h = norm_weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype)
        out = F.linear(h, weight, bias)
        return (SiluAndMul().forward_native(out) if silu_mul else out), s


def _granite_layer() -> GraniteDecoderLayer:
    config = tiny_granite_config()
    rope = RotaryEmbedding(16, 16, 64, {"rope_theta": 10000.0, "rope_type": "default"})
    layer = GraniteDecoderLayer(config, rope, False, False, False, "model.layers.0")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    q_size = layer.self_attn.q_size
    # stand-in for paged attention: a fixed function of qkv [T, q + 2 kv] -> [T, q_size]
    layer.self_attn.attend = lambda pos, qkv, kv, md: qkv[:, :q_size] * 0.5 + qkv[:, -1:]
    return layer


@torch.no_grad()
def test_granite_small_batch_path_equals_eager_layer():
    """forward_small_batch (the CUDA one-row path) scales the attention and MLP outputs by
    residual_multiplier exactly as the eager forward, first layer (no residual) and later."""
    layer = _granite_layer()
    assert layer.residual_multiplier == 0.22
    gen = torch.Generator().manual_seed(1)
    h, r = torch.randn(1, 64, generator=gen), torch.randn(1, 64, generator=gen)
    pos = torch.zeros(1, dtype=torch.long)
    for res in (None, r):
        want = layer(pos, h, None, None, res)  # CPU: the eager path
        got = layer.forward_small_batch(TorchGemv, pos, h, None, None, res)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # the multiplier matters: without it the layer computes something else
    layer.residual_multiplier = None
    plain = layer.forward_small_batch(TorchGemv, pos, h, None, None, r)
    assert not torch.allclose(plain[0], want[0]) and not torch.allclose(plain[1], want[1])


@torch.no_grad()
def test_granite_logits_divided_in_model_dtype():
    """compute_logits = (lm_head(h) / logits_scaling) in the model's dtype, then float32 (as
    transformers); ``float32=False`` returns the same values before the conversion. A
    scaling of 3 (not a power of two) rounds differently in bf16 than in float32."""
    model = GraniteForCausalLM(tiny_granite_config(vocab_size=96, logits_scaling=3.0))
    gen = torch.Generator().manual_seed(2)
    model.lm_head.weight.copy_(torch.randn(96, 64, generator=gen))  # tied: the embedding's
    model = model.to(torch.bfloat16)
    h = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    want = F.linear(h, model.lm_head.weight) / 3.0  # bf16
    low = model.compute_logits(h, float32=False)
    assert low.dtype == torch.bfloat16 and torch.equal(low, want)
    full = model.compute_logits(h)
    assert full.dtype == torch.float32 and torch.equal(full, want.float())


def test_attention_scale_reaches_the_backend_spec():
    """Granite's attention_multiplier is every layer's softmax scale and the spec's (which
    FlashInfer plans with); a spec without it is refused naming the layer and both scales."""
    config = tiny_granite_config(vocab_size=96)
    model = GraniteForCausalLM(config)
    fields = attention_fields(config)
    assert fields == {"scale": 0.0625}
    spec = dict(num_heads=4, num_kv_heads=2, head_size=16, block_size=16,
                dtype=torch.float32, device=torch.device("cpu"))  # fmt: skip
    check_layers_match_spec(model, AttentionSpec(**spec, **fields))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.attn has softmax "
                                         r"scale 0\.0625, the backend's 0\.25"):  # fmt: skip
        check_layers_match_spec(model, AttentionSpec(**spec))


def test_smollm3_rope_layers_follow_transformers():
    """A layer has a rotary embedding exactly where transformers' ``no_rope_layers`` says 1;
    without the list, every ``no_rope_layer_interval``-th layer is NoPE, as transformers
    derives it."""
    from types import SimpleNamespace

    from transformers import SmolLM3Config

    config = tiny_smollm3_config(vocab_size=96)
    assert config.no_rope_layers == [1, 0, 1, 0]
    model = SmolLM3ForCausalLM(config)
    has_rope = [layer.self_attn.rotary_emb is not None for layer in model.model.layers]
    assert has_rope == [True, False, True, False]
    explicit = tiny_smollm3_config(vocab_size=96, no_rope_layers=[0, 1, 1, 1])
    model = SmolLM3ForCausalLM(explicit)
    assert [layer.self_attn.rotary_emb is not None for layer in model.model.layers] == [
        False, True, True, True,
    ]  # fmt: skip
    bare = SimpleNamespace(num_hidden_layers=9, no_rope_layers=None, no_rope_layer_interval=4)
    assert smollm3_rope_layers(bare) == [bool(f) for f in SmolLM3Config(
        num_hidden_layers=9, no_rope_layer_interval=4).no_rope_layers]  # fmt: skip
