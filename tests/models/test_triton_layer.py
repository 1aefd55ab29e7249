"""The fused one-token decoder layer (vllm/model_executor/layers/triton_layer.py).

Reference: the same layer run as separate kernels, ``LlamaDecoderLayer.forward_small_batch``
with ``VLLM_FUSED_DECODER_LAYER=0`` (the default; the fused runs set it to 1): the four
:mod:`triton_gemv` projections and FLASHINFER's small-decode attention
(:func:`triton_decode.paged_decode_attention`) over the same cache. The fused kernel runs
the same per-program arithmetic, so under ``TRITON_INTERPRET=1`` (CPU, one program that
loops over every tile) the layer output, the residual and the written cache must be equal
bit for bit, in float32 and bfloat16, with and without the residual and a qkv bias, for one-
split and multi-split (merged) contexts. Both are checked against the layer's torch forward
too (so a bug shared by both paths fails). The barrier counters and the merge counters must
be back at zero after each launch.

GPU (``gpu`` marker): the compiled kernel with one program per SM (the grid barriers for
real), bf16 and float32, same comparisons with a tolerance: the projections differ from the
separate kernels by FMA contraction (this kernel compiles without it, as the attention
needs), and so, through the key's projection, does the cached key.
"""

import importlib.util
import math
import os

import pytest
import torch
from transformers import LlamaConfig

from tests.utils import run_interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

BLOCK = 16
HIDDEN, INTER, HEADS, KV_HEADS, HEAD = 96, 200, 6, 2, 16
LENS = (1, 5, 40, 700)  # 700 > the 128-token tile: six splits, merged


def _layer(dtype, device, bias):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from vllm.model_executor.models.llama import LlamaDecoderLayer

    cfg = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HEAD, rms_norm_eps=1e-5,
        max_position_embeddings=1024,
    )  # fmt: skip
    rope = RotaryEmbedding(HEAD, HEAD, 1024, {"rope_theta": 10000.0, "rope_type": "default"})
    layer = LlamaDecoderLayer(cfg, rope, bias, False, False, "model.layers.0")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return layer.to(device=device, dtype=dtype)


def _step(length, dtype, device, seed):
    """A cache with ``length - 1`` random cached tokens in shuffled blocks, and metadata."""
    from vllm.attention.backends.abstract import ForwardMode
    from vllm.attention.backends.small_decode import SmallDecodeMetadata
    from vllm.attention.triton_decode import DecodeWorkspace

    gen = torch.Generator().manual_seed(seed)
    nb = math.ceil(length / BLOCK)
    num_blocks = nb + 2
    table = torch.randperm(num_blocks, generator=gen)[:nb].to(torch.int32)[None]  # [1, nb]
    cache = torch.randn(num_blocks + 1, 2, BLOCK, KV_HEADS, HEAD, generator=gen).to(dtype)
    lens = torch.tensor([length], dtype=torch.int32)
    ws = DecodeWorkspace(1, HEADS, KV_HEADS, HEAD, torch.device(device))
    md = SmallDecodeMetadata(
        mode=ForwardMode.DECODE, num_rows=1, num_tokens=1, slot_mapping=lens.to(device),
        scratch_slot=num_blocks * BLOCK, seq_lens=lens.to(device),
        block_tables=table.to(device), block_size=BLOCK, max_seq_len=length, workspace=ws,
    )  # fmt: skip
    pos = torch.tensor([length - 1], device=device)
    return cache.to(device), md, pos


def _run(layer, gemv, fused, pos, h, res, cache, md):
    old = os.environ.get("VLLM_FUSED_DECODER_LAYER")
    os.environ["VLLM_FUSED_DECODER_LAYER"] = "1" if fused else "0"
    try:
        return layer.forward_small_batch(gemv, pos, h, cache, md, res)
    finally:
        if old is None:
            del os.environ["VLLM_FUSED_DECODER_LAYER"]
        else:
            os.environ["VLLM_FUSED_DECODER_LAYER"] = old


@torch.no_grad()
def _cases(dtype, device, exact_proj: bool) -> int:
    from vllm.model_executor.layers import triton_gemv, triton_layer

    checked = 0
    gen = torch.Generator().manual_seed(4)
    for bias in (False, True):
        layer = _layer(dtype, device, bias)
        for i, length in enumerate(LENS):
            h = torch.randn(1, HIDDEN, generator=gen).to(device=device, dtype=dtype)
            r = torch.randn(1, HIDDEN, generator=gen).to(device=device, dtype=dtype)
            for res in (None, r):
                cache, md, pos = _step(length, dtype, device, seed=10 * i + bias)
                ref_cache = cache.clone()
                want_h, want_r = _run(layer, triton_gemv, False, pos, h, res, ref_cache, md)
                calls = []
                real = triton_layer.decoder_layer
                triton_layer.decoder_layer = lambda *a, _r=real, _c=calls: _c.append(1) or _r(*a)
                try:
                    got_h, got_r = _run(layer, triton_gemv, True, pos, h, res, cache, md)
                finally:
                    triton_layer.decoder_layer = real
                ctx = f"{dtype} bias={bias} L={length} residual={res is not None}"
                assert calls == [1], f"{ctx}: the fused kernel did not run"
                if exact_proj:
                    assert torch.equal(cache, ref_cache), f"{ctx}: cache differs"
                    assert torch.equal(got_r, want_r), f"{ctx}: residual differs"
                    assert torch.equal(got_h, want_h), f"{ctx}: output differs"
                else:
                    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
                    torch.testing.assert_close(cache, ref_cache, **tol)  # k from the qkv GEMV
                    torch.testing.assert_close(got_r, want_r, **tol)
                    torch.testing.assert_close(got_h, want_h, **tol)
                ws = md.workspace
                assert not ws.layer_sync.any().item(), f"{ctx}: barrier counters not reset"
                assert not ws.counters.any().item(), f"{ctx}: merge counters not reset"
                if dtype == torch.float32:  # and both against the plain torch layer
                    _vs_torch(layer, pos, h, res, cache, md, length, got_h, ctx)
                checked += 1
    return checked


def _vs_torch(layer, pos, h, res, cache, md, length, got_h, ctx):
    """The layer's torch forward (no Triton) with float64 attention over the cached tokens
    (positions < length - 1, untouched by the step) and the new token."""
    from vllm.model_executor.layers.triton_dispatch import ENV_USE_TRITON_GEMV

    table = md.block_tables.cpu()[0].long()
    t = torch.arange(length - 1)
    c = cache.cpu().double()
    old_k, old_v = c[table[t // BLOCK], 0, t % BLOCK], c[table[t // BLOCK], 1, t % BLOCK]

    def attend(positions, qkv, kv_cache, attn_metadata):
        q, k, v = qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q, k = layer.self_attn.rotary_emb.forward_native(positions, q, k)
        keys = torch.cat([old_k, k.cpu().double().view(1, KV_HEADS, HEAD)])  # [L, KVH, D]
        vals = torch.cat([old_v, v.cpu().double().view(1, KV_HEADS, HEAD)])
        kh = keys.repeat_interleave(HEADS // KV_HEADS, dim=1)  # [L, HEADS, D]
        vh = vals.repeat_interleave(HEADS // KV_HEADS, dim=1)
        qh = q.cpu().double().view(HEADS, HEAD)
        p = torch.softmax(torch.einsum("hd,lhd->hl", qh, kh) * HEAD**-0.5, dim=-1)
        return torch.einsum("hl,lhd->hd", p, vh).reshape(1, -1).to(qkv)

    layer.self_attn.attend = attend  # an instance attribute shadows the method
    old = os.environ.get(ENV_USE_TRITON_GEMV)
    os.environ[ENV_USE_TRITON_GEMV] = "0"
    try:
        want_h, _ = layer(pos, h, cache, md, res)
    finally:
        del layer.self_attn.attend
        if old is None:
            del os.environ[ENV_USE_TRITON_GEMV]
        else:
            os.environ[ENV_USE_TRITON_GEMV] = old
    torch.testing.assert_close(got_h, want_h, rtol=1e-4, atol=1e-4, msg=lambda e: ctx + e)


def _check_interpreted() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    from vllm.model_executor.layers import triton_layer

    assert isinstance(triton_layer._decoder_layer_kernel, InterpretedFunction)
    for dtype in (torch.float32, torch.bfloat16):
        assert _cases(dtype, "cpu", exact_proj=True) == 16


def test_interpreted():
    """Fused == separate kernels, bit for bit, under the interpreter (one program)."""
    run_interpreted(__file__, "_check_interpreted")


@pytest.mark.gpu
def test_cuda():
    """The compiled kernel, one program per SM: barriers, the merge and the cache write."""
    for dtype in (torch.float32, torch.bfloat16):
        assert _cases(dtype, "cuda", exact_proj=False) == 16


def test_dispatch_rule(monkeypatch):
    """Off by default; on with VLLM_FUSED_DECODER_LAYER=1 for one row of a step that offers
    PagedDecodeTables (the small-decode path) and a layer small enough for the tiled GEMV
    tiles the fused layer runs; never for two rows, other metadata or a large layer."""
    from vllm.attention.backends.abstract import AttentionMetadata, ForwardMode
    from vllm.model_executor.layers.triton_dispatch import get_triton_layer

    _, md, _ = _step(5, torch.float32, "cpu", seed=0)
    plain = AttentionMetadata(ForwardMode.DECODE, 1, 1, md.slot_mapping, 0)
    one, two = torch.zeros(1, HIDDEN), torch.zeros(2, HIDDEN)
    small = torch.empty(2 * 1536, 576, dtype=torch.bfloat16)  # SmolLM2's gate_up, 3.4 MiB
    large = torch.empty(2 * 14336, 4096, dtype=torch.bfloat16)  # Llama-3.1-8B's, 224 MiB
    monkeypatch.delenv("VLLM_FUSED_DECODER_LAYER", raising=False)
    assert get_triton_layer(one, md, small) is None
    monkeypatch.setenv("VLLM_FUSED_DECODER_LAYER", "1")
    layer, tables = get_triton_layer(one, md, small)
    assert hasattr(layer, "decoder_layer") and tables.seq_lens is md.seq_lens
    assert tables.scratch_block == md.scratch_slot // BLOCK
    assert get_triton_layer(two, md, small) is None
    assert get_triton_layer(one, plain, small) is None
    assert get_triton_layer(one, None, small) is None
    assert get_triton_layer(one, md, large) is None  # it takes the whole-row kernel
