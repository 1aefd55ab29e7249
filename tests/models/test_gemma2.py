"""Gemma 2's attention settings, layer by layer, without an engine (test_families.py
compares the family with transformers end to end, HF directory and GGUF file):

- every layer's softmax scale is ``query_pre_attn_scalar ** -0.5`` and its score cap
  ``attn_logit_softcapping``; sliding layers carry the window; the backend's spec gets the
  same (FlashInfer plans with it), and a spec without the cap is refused at load;
- a config without ``layer_types`` slides on even layers, as transformers' Gemma2Config.
"""

import pytest
import torch
from tiny_models import tiny_gemma2_config

from vllm.attention.backends.abstract import AttentionSpec
from vllm.attention.layer import check_layers_match_spec
from vllm.model_executor.models import attention_fields, full_attention_limit
from vllm.model_executor.models.gemma2 import Gemma2ForCausalLM


def _attn(model, i):
    return model.model.layers[i].self_attn.attn


def test_layers_carry_scale_cap_and_window_as_the_spec():
    """Scale, cap and window per layer equal the spec's fields; a spec without the cap is
    refused naming the first layer; with the window disabled the context is capped at it."""
    config = tiny_gemma2_config(vocab_size=96)
    model = Gemma2ForCausalLM(config)
    layers = [_attn(model, i) for i in range(4)]
    settings = [(a.scale, a.logits_soft_cap, a.sliding_window) for a in layers]
    assert settings == [(48**-0.5, 2.0, 8), (48**-0.5, 2.0, None)] * 2
    fields = attention_fields(config)
    assert fields == {"sliding_windows": (8,), "scale": 48**-0.5, "logits_soft_cap": 2.0}
    spec = dict(num_heads=2, num_kv_heads=1, head_size=64, block_size=16,
                dtype=torch.float32, device=torch.device("cpu"))  # fmt: skip
    check_layers_match_spec(model, AttentionSpec(**spec, **fields))
    no_cap = {**fields, "logits_soft_cap": None}
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.attn has score cap 2\.0"):
        check_layers_match_spec(model, AttentionSpec(**spec, **no_cap))
    assert full_attention_limit(config, disable_sliding_window=True) == 8


def test_config_without_layer_types_slides_on_even_layers():
    """Without ``layer_types`` the windows fall on layers 0 and 2 (transformers' default
    list); a config without a score cap gives layers and spec no cap."""
    from transformers import Gemma2Config

    config = tiny_gemma2_config(vocab_size=96, attn_logit_softcapping=None)
    assert config.layer_types == Gemma2Config(num_hidden_layers=4).layer_types
    config.layer_types = None  # a config written before transformers listed them
    model = Gemma2ForCausalLM(config)
    assert [_attn(model, i).sliding_window for i in range(4)] == [8, None, 8, None]
    assert _attn(model, 0).logits_soft_cap is None
    assert attention_fields(config)["logits_soft_cap"] is None
