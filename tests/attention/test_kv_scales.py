"""KV-cache scales without an engine: the cache arithmetic (vllm/attention/kv_cache_dtype.py),
how checkpoint names load into the attention layers (vllm/model_executor/layers/
kv_scales.py), and FLASHINFER's paths on CPU (fake wrappers of tests/worker/fakes.py, which
apply ``k_scale`` / ``v_scale`` as FlashInfer's ``run`` does) against TORCH_SDPA's.
The engine against transformers is tests/attention/test_fp8_kv_scales_engine.py."""

from types import SimpleNamespace

import pytest
import torch

from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.kv_cache_dtype import (
    as_stored,
    from_cache,
    layer_kv_scales,
    store_rows,
    to_cache,
)

E4M3 = torch.float8_e4m3fn


def test_to_cache_divides_by_the_scale_and_from_cache_multiplies_back():
    """An 8-bit cache stores clamp(x / scale) rounded and reads it back times the scale; a
    cache of the model's dtype stores x itself whatever the scale; store_rows writes the
    bytes of to_cache at that scale."""
    x = torch.tensor([[10.0, -1000.0, 0.3, 1e-9]])
    stored = to_cache(x, E4M3, 0.5)  # x / 0.5 = [20, -2000 -> -448, 0.6 -> 0.625, 0]
    assert stored.dtype == E4M3 and stored.float().tolist() == [[20.0, -448.0, 0.625, 0.0]]
    assert from_cache(stored, torch.float32, 0.5).tolist() == [[10.0, -224.0, 0.3125, 0.0]]
    assert as_stored(x, E4M3, 0.5).tolist() == [[10.0, -224.0, 0.3125, 0.0]]
    # scale 1: the rounding of today (0.3 -> 0.3125, -1000 clamped to -448)
    assert as_stored(x, E4M3).tolist() == [[10.0, -448.0, 0.3125, 0.0]]
    assert to_cache(x, torch.float32, 0.5) is x and as_stored(x, torch.float32, 0.5) is x
    assert to_cache(x, torch.float8_e5m2, 4.0).float().tolist() == [[2.5, -256.0, 0.078125, 0.0]]

    cache = torch.zeros(3, 1, 4, dtype=E4M3)  # [rows, kv_heads, D]
    store_rows(cache, torch.tensor([2]), x[:, None], 0.5)
    assert torch.equal(cache[2].view(torch.uint8), stored.view(torch.uint8))
    assert not cache[:2].float().any()

    layer = SimpleNamespace(k_scale_float=0.05, v_scale_float=3.0)
    assert layer_kv_scales(layer, E4M3) == (0.05, 3.0)
    assert layer_kv_scales(layer, torch.float8_e5m2) == (0.05, 3.0)
    assert layer_kv_scales(layer, torch.bfloat16) == (1.0, 1.0)  # auto: unused
    assert layer_kv_scales(SimpleNamespace(), E4M3) == (1.0, 1.0)


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_checkpoint_scale_spellings_load_into_the_attention_layers(family, caplog):
    """compressed-tensors' ``self_attn.k_scale``, older llm-compressor's
    ``k_proj.output_scale``, ModelOpt's ``k_proj.k_scale``, AutoFP8's single ``kv_scale``
    (both scales) and the ``.attn.`` form load as float32 scalars; a layer without scales
    keeps 1.0; ``q_scale`` and a scale of a module the model lacks are skipped with one
    warning; a scale that is not one positive value is refused, naming the tensor."""
    import tiny_models

    from vllm.model_executor.layers.kv_scales import kv_scales_of
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

    if family == "llama":
        model = LlamaForCausalLM(tiny_models.tiny_llama_config(num_hidden_layers=4))
    else:
        model = Qwen2ForCausalLM(tiny_models.tiny_qwen2_config(num_hidden_layers=4))
    p = "model.layers"
    weights = [
        (f"{p}.0.self_attn.k_scale", torch.tensor(0.05)),
        (f"{p}.0.self_attn.v_scale", torch.tensor([3.0])),
        (f"{p}.1.self_attn.k_proj.output_scale", torch.tensor([0.3], dtype=torch.bfloat16)),
        (f"{p}.1.self_attn.v_proj.output_scale", torch.tensor(2.0, dtype=torch.float64)),
        (f"{p}.2.self_attn.kv_scale", torch.tensor(0.5)),
        (f"{p}.2.self_attn.q_scale", torch.tensor(7.0)),
        (f"{p}.3.self_attn.k_proj.k_scale", torch.tensor(0.125)),
        (f"{p}.3.self_attn.attn.v_scale", torch.tensor(6.0)),
        ("model.vision_tower.layers.0.self_attn.k_scale", torch.tensor(9.0)),
    ]
    with caplog.at_level("WARNING", logger="vllm.model_executor.layers.kv_scales"):
        assert model.load_weights(weights) == set()
    assert kv_scales_of(model) == [
        (_f32(0.05), 3.0),
        (_f32(torch.tensor(0.3, dtype=torch.bfloat16).item()), 2.0),
        (0.5, 0.5),
        (0.125, 6.0),
    ]
    attn = model.model.layers[0].self_attn.attn
    assert attn.k_scale.dtype == torch.float32 and attn.k_scale.shape == ()
    assert attn.k_scale.item() == _f32(0.05) and attn.v_scale.item() == 3.0
    assert "k_scale" not in dict(model.named_parameters())  # not a required parameter
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 1 and "Skipped 2 attention scale tensors" in skipped[0], skipped
    assert kv_scales_of(type(model)(model.config)) == [(1.0, 1.0)] * 4  # defaults

    for bad, why in ((torch.tensor([0.1, 0.2]), "per-head"), (torch.tensor(0.0), "positive")):
        with pytest.raises(ValueError, match=rf"'{p}\.1\.self_attn\.k_scale'.*{why}"):
            model.load_weights([(f"{p}.1.self_attn.k_scale", bad)])


def test_fp8_checkpoint_filter_keeps_kv_scales():
    """The fp8 checkpoint loaders drop static activation scales and zero points but pass
    the KV-cache scales on, in every spelling."""
    from vllm.model_executor.layers.fp8_checkpoint import is_unused_tensor

    p = "model.layers.0.self_attn"
    for kept in ("k_scale", "v_scale", "k_proj.output_scale", "v_proj.output_scale",
                 "kv_scale", "k_proj.k_scale"):  # fmt: skip
        assert not is_unused_tensor(f"{p}.{kept}"), kept
    for dropped in ("q_proj.input_scale", "q_proj.output_scale", "o_proj.weight_zero_point"):
        assert is_unused_tensor(f"{p}.{dropped}"), dropped


H, H_KV, D, BS, NB = 4, 2, 8, 4, 6
SCRATCH = NB * BS
TABLE = [2, 0, 4]


def _steps():
    """A prefill of 7 tokens, a decode of the 8th, then a prefill of 3 more over the 8
    cached ones (prefix caching's shape), all on blocks ``TABLE``."""
    slot = lambda p: TABLE[p // BS] * BS + p % BS  # noqa: E731
    return [
        StepInputs(ForwardMode.PREFILL, [7], [7], [TABLE[:2]], [slot(p) for p in range(7)], 1),
        StepInputs(ForwardMode.DECODE, [8], [1], [TABLE[:2]], [slot(7)], 1),
        StepInputs(ForwardMode.PREFILL, [11], [3], [TABLE], [slot(p) for p in range(8, 11)], 1),
    ]


def _layer(k_scale: float, v_scale: float) -> SimpleNamespace:
    return SimpleNamespace(num_heads=H, num_kv_heads=H_KV, head_size=D, scale=D**-0.5,
                           k_scale_float=k_scale, v_scale_float=v_scale)  # fmt: skip


def _run(backend, layer, cache_dtype=E4M3):
    """Run ``_steps`` through ``backend`` (random q/k/v, seeded); returns (outputs per
    step, the cache, the keys and values of every step)."""
    g = torch.Generator().manual_seed(0)
    shape = backend.get_kv_cache_shape(NB + 1, BS, H_KV, D)
    cache = torch.zeros(shape, dtype=cache_dtype)
    outs, keys, values = [], [], []
    for step in _steps():
        n = len(step.slot_mapping)
        q = torch.randn(n, H * D, generator=g)
        k, v = torch.randn(n, H_KV * D, generator=g), torch.randn(n, H_KV * D, generator=g)
        md = backend.build_metadata(step, SCRATCH)
        outs.append(md.impl.forward(layer, q, k, v, cache, md))
        keys.append(k.view(n, H_KV, D))
        values.append(v.view(n, H_KV, D))
    return outs, cache, torch.cat(keys), torch.cat(values)


def _spec(kv_dtype):
    return AttentionSpec(H, H_KV, D, BS, torch.float32, torch.device("cpu"),
                         small_decode_max_rows=4, kv_cache_dtype=kv_dtype)  # fmt: skip


def test_flashinfer_applies_the_layer_scales_like_torch_sdpa():
    """With an e4m3 cache and k_scale 0.05 / v_scale 3.0: both backends store the same
    bytes, ``key / k_scale`` rounded; FlashInfer's wrappers get the scales in ``run`` (the
    prefill, the decode and the prefill over a cached prefix) and give TORCH_SDPA's outputs,
    which differ from scale 1's; FLASHINFER's graph prefill gives TORCH_SDPA's plain prefill
    exactly. A float32 (``auto``) cache ignores the scales: ``run`` gets none."""
    from vllm.attention.backends.flashinfer.flashinfer import FlashInferBackend
    from vllm.attention.backends.flashinfer.flashinfer_prefill import (
        GraphPrefillImpl,
        graph_prefill_metadata,
    )
    from vllm.attention.backends.flashinfer.paged_cache import slot_rows_host
    from vllm.attention.backends.torch_sdpa import TorchSDPABackend

    layer = _layer(0.05, 3.0)
    fi = FlashInferBackend(_spec(E4M3), FakePrefillWrapper, FakeDecodeWrapper, prebuild=False)
    fi_out, fi_cache, keys, values = _run(fi, layer)
    sd_out, sd_cache, _, _ = _run(TorchSDPABackend(_spec(E4M3)), layer)
    assert (fi.prefill_runs, fi.decode_runs, fi.small_decode_runs) == (2, 1, 0)
    prefill, decode = fi._eager_wrappers()
    assert prefill.kv_scales == decode.kv_scales == (0.05, 3.0)
    for a, b in zip(fi_out, sd_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # the same bytes in both layouts, key / k_scale and value / v_scale rounded
    assert torch.equal(fi_cache.transpose(0, 1).view(torch.uint8), sd_cache.view(torch.uint8))
    slots = torch.tensor([TABLE[p // BS] * BS + p % BS for p in range(11)])
    flat = sd_cache.view(2, -1, H_KV, D)
    assert torch.equal(
        flat[0, slots].view(torch.uint8), to_cache(keys, E4M3, 0.05).view(torch.uint8)
    )
    assert torch.equal(flat[1, slots].float(), to_cache(values, E4M3, 3.0).float())
    unscaled, _, _, _ = _run(TorchSDPABackend(_spec(E4M3)), _layer(1.0, 1.0))
    assert all(not torch.allclose(a, b, atol=1e-3) for a, b in zip(sd_out, unscaled))

    # graph prefill (no wrapper) = TORCH_SDPA's plain prefill of the same 7 tokens
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, h * D, generator=g) for h in (H, H_KV, H_KV))
    cache = torch.zeros(FlashInferBackend.get_kv_cache_shape(NB + 1, BS, H_KV, D), dtype=E4M3)
    rows = slot_rows_host(_steps()[0].slot_mapping, SCRATCH, BS)
    out = GraphPrefillImpl.forward(layer, q, k, v, cache, graph_prefill_metadata(rows, SCRATCH))
    assert torch.equal(out, sd_out[0])

    plain = FlashInferBackend(_spec(None), FakePrefillWrapper, FakeDecodeWrapper, prebuild=False)
    plain.small_max_rows = 0  # decode on the wrapper too
    out32, cache32, keys, _ = _run(plain, layer, torch.float32)
    prefill, decode = plain._eager_wrappers()
    assert prefill.kv_scales == decode.kv_scales == (None, None)
    assert torch.equal(cache32.transpose(0, 1).reshape(2, -1, H_KV, D)[0, slots], keys)
