"""Partial rotary embeddings (Phi-4-mini: ``partial_rotary_factor`` 0.75) against
transformers' Phi-3 rotary and ``apply_rotary_pos_emb`` on random tensors, and the rules
that read and check the factor. The engine end to end: tests/models/test_families.py
(``tiny_phi4_mini_dir``); the Triton kernels: tests/kernels/test_norm_rotary.py."""

from types import SimpleNamespace

import pytest
import torch

from tests.models import tiny_models
from vllm.model_executor.layers.rotary_embedding import (
    RotaryEmbedding,
    get_rope_parameters,
    partial_rotary_dim,
)

HEAD_DIM, ROTARY_DIM = 16, 12  # tiny_phi4_mini_config: 64 hidden / 4 heads, factor 0.75


def _default_rope_config():
    """tiny_phi4_mini_config with unscaled RoPE (no LongRoPE factor lists)."""
    params = {"rope_type": "default", "rope_theta": 10000.0}
    return tiny_models.tiny_phi4_mini_config(rope_parameters=params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rope", ["default", "longrope"])
def test_rotation_equals_transformers(rope, dtype):
    """forward_native rotates the first 12 channels of each 16-channel head and copies the
    last 4, bit for bit as transformers' Phi-3 (its rotary module at the same positions,
    then ``apply_rotary_pos_emb``), for GQA query and key heads; longrope positions stay
    below the original context, where transformers uses the short factors too."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    config = tiny_models.tiny_phi4_mini_config() if rope == "longrope" else _default_rope_config()
    assert partial_rotary_dim(config, HEAD_DIM) == ROTARY_DIM
    ours = RotaryEmbedding(HEAD_DIM, ROTARY_DIM, 512, get_rope_parameters(config))
    assert ours.cos_sin_cache.shape == (512, ROTARY_DIM)
    hf = Phi3RotaryEmbedding(config)
    gen = torch.Generator().manual_seed(0)
    t = 9
    positions = torch.randint(0, 128, (t,), generator=gen)  # unsorted
    q = torch.randn(t, 4 * HEAD_DIM, generator=gen).to(dtype)  # [T, heads * head_dim]
    k = torch.randn(t, 2 * HEAD_DIM, generator=gen).to(dtype)  # [T, kv_heads * head_dim]
    cos, sin = hf(q, positions[None])  # [1, T, ROTARY_DIM] each, in q's dtype
    hq, hk = apply_rotary_pos_emb(
        q.view(1, t, 4, HEAD_DIM).transpose(1, 2), k.view(1, t, 2, HEAD_DIM).transpose(1, 2),
        cos, sin,
    )  # fmt: skip
    want_q = hq.transpose(1, 2).reshape(t, -1)  # [T, heads * head_dim]
    want_k = hk.transpose(1, 2).reshape(t, -1)
    got_q, got_k = ours.forward_native(positions, q, k)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    for got, x in ((got_q, q), (got_k, k)):
        heads = got.view(t, -1, HEAD_DIM)  # [T, heads, head_dim]
        assert torch.equal(heads[..., ROTARY_DIM:], x.view(t, -1, HEAD_DIM)[..., ROTARY_DIM:])
        assert not torch.equal(heads[..., :ROTARY_DIM], x.view(t, -1, HEAD_DIM)[..., :ROTARY_DIM])


def test_rotary_dim_from_either_spelling():
    """The factor is read from ``rope_parameters`` (transformers 5) or from the config's
    attribute (a config.json as Phi-4-mini ships it, read without transformers 5's
    normalisation); without either every channel rotates."""
    assert partial_rotary_dim(tiny_models.tiny_phi4_mini_config(), HEAD_DIM) == ROTARY_DIM
    attr_only = SimpleNamespace(partial_rotary_factor=0.75, rope_theta=1e4)
    assert partial_rotary_dim(attr_only, 128) == 96  # Phi-4-mini's heads
    params_only = SimpleNamespace(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5})
    assert partial_rotary_dim(params_only, 128) == 64
    assert partial_rotary_dim(SimpleNamespace(rope_theta=1e4), 128) == 128
    assert partial_rotary_dim(tiny_models.tiny_phi3_config(), HEAD_DIM) == HEAD_DIM


@pytest.mark.parametrize(
    "factor, words",
    [
        (1.5, r"partial_rotary_factor=1.5 must be in \(0, 1\]"),
        (0.0, r"partial_rotary_factor=0.0 must be in \(0, 1\]"),
        (0.3125, r"rotary_dim = int\(16 \* 0.3125\) = 5; it must be even"),
        (0.1, r"rotary_dim = int\(16 \* 0.1\) = 1; it must be even and at least 2"),
        ("abc", r"partial_rotary_factor='abc' must be a number in \(0, 1\]"),
    ],
)
def test_invalid_factors_are_refused(factor, words):
    """A factor outside (0, 1] or one whose rotary dim is odd or 0 is refused by name."""
    config = SimpleNamespace(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": factor})
    with pytest.raises(ValueError, match=words):
        partial_rotary_dim(config, HEAD_DIM)


def test_rotary_embedding_refuses_a_bad_rotary_dim():
    params = {"rope_theta": 1e4, "rope_type": "default"}
    for rotary_dim in (7, 0, 18):
        with pytest.raises(ValueError, match=rf"rotary_dim={rotary_dim} must be even and in "
                                             r"\[2, head_size=16\]"):  # fmt: skip
            RotaryEmbedding(HEAD_DIM, rotary_dim, 32, params)


def test_hf_overrides_factor_reaches_the_rotary(tmp_path, tiny_phi4_mini_dir):
    """``--hf-overrides '{"partial_rotary_factor": ...}'`` changes the factor the model reads
    (transformers 5 keeps it in ``rope_parameters``, which is read first), and a bad one is
    refused by name."""
    from vllm.engine.arg_utils import EngineArgs

    def rotary_dim(factor):
        config = EngineArgs(
            model=tiny_phi4_mini_dir, hf_overrides={"partial_rotary_factor": factor}
        ).create_engine_config()
        return partial_rotary_dim(config.model_config.hf_config, HEAD_DIM)

    assert rotary_dim(0.5) == 8 and rotary_dim(1.0) == HEAD_DIM
    with pytest.raises(ValueError, match=r"partial_rotary_factor=1.5 must be in \(0, 1\]"):
        rotary_dim(1.5)
