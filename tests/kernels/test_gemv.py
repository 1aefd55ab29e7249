"""The small-batch projection kernels (vllm/kernels/gemv.py).

Reference: the unfused torch layers they replace (``RMSNorm.forward_native``,
``F.linear``, ``SiluAndMul.forward_native``) and, one level up, ``LlamaDecoderLayer.forward``
vs ``forward_small_batch`` with the attention stubbed out (the kernels are the only
difference). CPU: run under ``TRITON_INTERPRET=1`` (tests.utils.run_interpreted); float32
must match to float32 summation-order noise, bfloat16 (truncating interpreter) to about one
ulp of the output scale. GPU (``gpu`` marker): the compiled kernels, bfloat16 and float32,
and the dispatch rule (``get_triton_gemv``: CUDA, one row, small weights, the env switch).
"""

import importlib.util
import os
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from tests.utils import run_interpreted, skip_old_interpreter
from vllm.kernels.dispatch import get_triton_gemv
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ENV_USE_TRITON_GEMV = "VLLM_USE_TRITON_GEMV"
ROWS = (1, 2, 3, 5, 16)  # FMA paths (BLOCK_M 1, 2, 4) and the tl.dot path
# (N, K): N not a multiple of BLOCK_N 16, K not a multiple of BLOCK_K 128 (SmolLM2 hidden 576)
SIZES = ((40, 300), (200, 576))
# Under the interpreter SmolLM2's K takes 24 outputs instead of 200 (its 2N x K weight is
# an eighth of the size): the same tails (N % 16 = 8 at the tl.dot block, N % 8 = 0,
# N % 4 = 0; 2N = 48 a multiple of 16 as 400 is), the same K tiles, several programs at
# every block size, and several whole-row tiles per persistent program.
INTERPRETED_SIZES = ((40, 300), (24, 576))
EPS = 1e-5


def _tol(dtype: torch.dtype, scale: float) -> dict:
    """float32: summation order. bfloat16: the interpreter TRUNCATES each rounding (gate,
    up, silu, product: one ulp = 0.8% each, compounding), the GPU rounds to nearest; so
    5% on CPU (still far below the errors of a wrong formula, see _check_errors) and 2%
    on CUDA, relative to the output scale."""
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5 * scale)
    rel = 5e-2 if _INTERPRETED else 2e-2
    return dict(rtol=rel, atol=rel * scale)


@torch.no_grad()
def _kernel_cases(gemv: ModuleType, dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    act = SiluAndMul()
    # Under the interpreter bfloat16 takes the small size only (SmolLM2's K costs most of
    # the run, in float32 it is checked); on CUDA both dtypes take both of SIZES.
    sizes = INTERPRETED_SIZES if _INTERPRETED else SIZES
    if _INTERPRETED and dtype != torch.float32:
        sizes = sizes[:1]
    for n, k in sizes:
        norm = RMSNorm(k, eps=EPS)
        norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
        norm = norm.to(device=device, dtype=dtype)
        w = (torch.randn(2 * n, k, generator=gen) / k**0.5).to(device=device, dtype=dtype)
        b = torch.randn(2 * n, generator=gen).to(device=device, dtype=dtype)
        for m in ROWS:
            ctx = f"dtype={dtype} N={n} K={k} M={m}"
            wide = torch.randn(m, k + 8, generator=gen).to(device=device, dtype=dtype)
            x = wide[:, :k]  # [M, K], row stride K + 8
            r = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)

            got = gemv.linear(x, w, b)
            want = F.linear(x, w, b)
            assert got.shape == (m, 2 * n) and got.dtype == dtype, ctx
            torch.testing.assert_close(got, want, **_tol(dtype, 3.0), msg=lambda e, c=ctx: c + e)

            normed, s_want = norm.forward_native(x, r)
            got, s = gemv.norm_linear(x, r, norm.weight, EPS, w, b)
            assert s.dtype == dtype and s.shape == (m, k), ctx
            # one add rounded once in both (the interpreter truncates: one ulp)
            torch.testing.assert_close(s, s_want, rtol=8e-3 if dtype != torch.float32 else 0,
                                       atol=0)  # fmt: skip
            want = F.linear(normed, w, b)
            torch.testing.assert_close(got, want, **_tol(dtype, 3.0), msg=lambda e, c=ctx: c + e)

            got, s = gemv.norm_linear(x, None, norm.weight, EPS, w, None, silu_mul=True)
            assert s is x, ctx
            want = act.forward_native(F.linear(norm.forward_native(x), w))
            assert got.shape == (m, n), ctx
            torch.testing.assert_close(got, want, **_tol(dtype, 3.0), msg=lambda e, c=ctx: c + e)
        _wide_cases(gemv, dtype, norm, w, b, gen, device)
        # a row's value does not depend on the other rows of the launch (same BLOCK_M)
        x = torch.randn(16, k, generator=gen).to(device=device, dtype=dtype)
        assert torch.equal(gemv.linear(x[:7], w), gemv.linear(x, w)[:7]), f"{dtype} N={n}"
    _one_row_cases(gemv, dtype, gen, device)


def _wide_cases(gemv: ModuleType, dtype, norm, w, b, gen, device) -> None:
    """One row through the persistent whole-row kernel (gemv_rows: the config of
    large weights) vs the torch layers; 1 and 4 outputs per tile, 2 "SMs" on CPU, so
    programs take several tiles and prefetch past the last one."""
    cfg = gemv.launch_config(1, 1 << 12, 1 << 12)
    assert cfg == dict(PERSIST=4, BLOCK_N=gemv.ROWS_BLOCK_N, num_warps=8), cfg
    assert gemv.launch_config(1, 4096, 14336)["num_warps"] == 16  # 16384-wide tiles
    assert "PERSIST" not in gemv.launch_config(1, 1 << 12, 1000)  # K < ROWS_MIN_K
    for bn in (1, 4):
        _rows_cases(gemv, dtype, norm, w, b, gen, device, dict(cfg, BLOCK_N=bn))


def _one_row_cases(gemv: ModuleType, dtype, gen, device) -> None:
    """One row of a small weight: the whole row of K in one tile up to
    ONE_ROW_MAX_BLOCK_K (K = 576 -> 1024, masked past K), beyond it several tiles
    (K = 2500: 2048 + a masked 2048)."""
    cfg = gemv.launch_config(1, 200, 576)
    assert (cfg["BLOCK_N"], cfg["BLOCK_K"]) == (gemv.ONE_ROW_BLOCK_N, 1024), cfg
    k = 2500
    cfg = gemv.launch_config(1, 40, k)
    assert cfg["BLOCK_K"] == gemv.ONE_ROW_MAX_BLOCK_K == 2048, cfg
    norm = RMSNorm(k, eps=EPS)
    norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    norm = norm.to(device=device, dtype=dtype)
    w = (torch.randn(80, k, generator=gen) / k**0.5).to(device=device, dtype=dtype)
    b = torch.randn(80, generator=gen).to(device=device, dtype=dtype)
    _rows_cases(gemv, dtype, norm, w, b, gen, device, cfg)


def _rows_cases(gemv: ModuleType, dtype, norm, w, b, gen, device, cfg: dict) -> None:
    k = w.shape[1]
    act = SiluAndMul()
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    r = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    ctx = f"rows dtype={dtype} K={k} {cfg}"
    got, _ = gemv._launch(x, None, None, 0.0, w, b, False, cfg)
    torch.testing.assert_close(got, F.linear(x, w, b), **_tol(dtype, 3.0), msg=lambda e: ctx + e)
    normed, s_want = norm.forward_native(x, r)
    got, s = gemv._launch(x, r, norm.weight, EPS, w, b, False, cfg)
    # one add rounded once in both (the interpreter truncates: one ulp)
    torch.testing.assert_close(s, s_want, rtol=8e-3 if dtype != torch.float32 else 0, atol=0)
    torch.testing.assert_close(got, F.linear(normed, w, b), **_tol(dtype, 3.0),
                               msg=lambda e: ctx + e)  # fmt: skip
    got, s = gemv._launch(x, None, norm.weight, EPS, w, None, True, cfg)
    want = act.forward_native(F.linear(norm.forward_native(x), w))
    assert s is x, ctx
    torch.testing.assert_close(got, want, **_tol(dtype, 3.0), msg=lambda e: ctx + e)


def _interpreted_gemv() -> ModuleType:
    from triton.runtime.interpreter import InterpretedFunction

    from vllm.kernels import gemv

    assert isinstance(gemv._gemv_kernel, InterpretedFunction), "not interpreted"
    return gemv


def _check_kernels() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        _kernel_cases(_interpreted_gemv(), dtype, "cpu")


def _tiny_layer(dtype: torch.dtype, device: str, bias: bool, hidden: int = 96,
                inter: int = 200, heads: int = 6, kv_heads: int = 2):  # fmt: skip
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from vllm.model_executor.models.llama import LlamaDecoderLayer

    cfg = LlamaConfig(
        hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
        num_key_value_heads=kv_heads, rms_norm_eps=EPS, max_position_embeddings=64,
    )  # fmt: skip
    d = hidden // heads
    rope = RotaryEmbedding(d, d, 64, {"rope_theta": 10000.0, "rope_type": "default"})
    layer = LlamaDecoderLayer(cfg, rope, bias, False, False, "model.layers.0")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():  # weights ~ 0.2 at K = 96 (the tiny layer's scale)
            w = torch.randn(p.shape, generator=gen) * (0.2 * (96 / p.shape[-1]) ** 0.5)
            p.copy_(w + (1.0 if p.dim() == 1 else 0.0))
    layer = layer.to(device=device, dtype=dtype)
    q_size = layer.self_attn.q_size
    # stand-in for paged attention: any fixed function of qkv [T, q+2kv] -> [T, q_size]
    layer.self_attn.attend = lambda pos, qkv, kv, md: qkv[:, :q_size] * 0.5 + qkv[:, -1:]
    return layer


def _unfused(layer, pos, h, res):
    """The layer's plain forward (VLLM_USE_TRITON_GEMV=0 keeps a GPU off the fused path)."""
    old = os.environ.get(ENV_USE_TRITON_GEMV)
    os.environ[ENV_USE_TRITON_GEMV] = "0"
    try:
        return layer(pos, h, None, None, res)
    finally:
        if old is None:
            del os.environ[ENV_USE_TRITON_GEMV]
        else:
            os.environ[ENV_USE_TRITON_GEMV] = old


@torch.no_grad()
def _layer_cases(gemv: ModuleType, dtype: torch.dtype, device: str) -> None:
    """forward_small_batch == the unfused forward (residual None and given, with biases)."""
    gen = torch.Generator().manual_seed(2)
    # the interpreter: one FMA-path and one tl.dot-path token count (_check_kernels covers
    # every row path); CUDA adds 4
    tokens = (1, 9) if _INTERPRETED else (1, 4, 9)
    for bias in (False, True):
        layer = _tiny_layer(dtype, device, bias)
        for t in tokens:
            h = torch.randn(t, 96, generator=gen).to(device=device, dtype=dtype)
            r = torch.randn(t, 96, generator=gen).to(device=device, dtype=dtype)
            pos = torch.arange(t, device=device)
            for res in (None, r):
                want_h, want_r = _unfused(layer, pos, h, res)
                got_h, got_r = layer.forward_small_batch(gemv, pos, h, None, None, res)
                ctx = f"dtype={dtype} bias={bias} T={t} residual={res is not None}"
                torch.testing.assert_close(got_r, want_r, **_tol(dtype, 4.0),
                                           msg=lambda e, c=ctx: c + e)  # fmt: skip
                torch.testing.assert_close(got_h, want_h, **_tol(dtype, 4.0),
                                           msg=lambda e, c=ctx: c + e)  # fmt: skip


@torch.no_grad()
def _wide_layer_case(gemv: ModuleType) -> None:
    """A layer whose projections all take the whole-row kernel (Llama-3.1-8B's hidden and
    heads, intermediate 4096: every weight >= 16M elements), one token, bf16, CUDA:
    forward_small_batch == the unfused forward (cuBLAS) within bf16 noise; and the dispatch
    rule picks the kernel for it."""
    layer = _tiny_layer(torch.bfloat16, "cuda", False, 4096, 4096, 32, 8)
    mlp, attn = layer.mlp, layer.self_attn
    assert gemv.worthwhile(1, mlp.gate_up_proj.weight, attn.o_proj.weight)
    assert all(gemv.launch_config(1, *w.shape).get("PERSIST") for w in
               (attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight,
                mlp.down_proj.weight))  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16)
    r = torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16)
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    for res in (None, r):
        want_h, want_r = _unfused(layer, pos, h, res)
        got_h, got_r = layer.forward_small_batch(gemv, pos, h, None, None, res)
        torch.testing.assert_close(got_r, want_r, **_tol(torch.bfloat16, 4.0))
        scale = want_h.abs().max().item()
        torch.testing.assert_close(got_h, want_h, **_tol(torch.bfloat16, scale))


def _check_layer() -> None:
    # float32 only: four truncating bf16 projections in a row compound past any fair bound
    _layer_cases(_interpreted_gemv(), torch.float32, "cpu")


def _check_errors() -> None:
    gemv = _interpreted_gemv()
    w = torch.randn(8, 32)
    assert gemv.linear(torch.empty(0, 32), w).shape == (0, 8)
    with pytest.raises(ValueError, match="17 rows > MAX_ROWS=16"):
        gemv.linear(torch.randn(17, 32), w)
    with pytest.raises(ValueError, match=r"x must be \[rows, 32\], got \(2, 31\)"):
        gemv.linear(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="even weight height, got 7"):
        gemv.norm_linear(torch.randn(2, 32), None, torch.ones(32), EPS, w[:7], silu_mul=True)
    # the checks can fail: a missing norm weight multiply is caught
    x = torch.randn(3, 32)
    norm = RMSNorm(32, EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32) + 0.5)
    bad, _ = gemv.norm_linear(x, None, torch.ones(32), EPS, w)
    assert not torch.allclose(bad, F.linear(norm.forward_native(x), w), **_tol(torch.float32, 3))


@pytest.mark.parametrize("case", ["_check_kernels", "_check_layer", "_check_errors"])
def test_interpreted(case):
    """float32 and bfloat16 under the interpreter vs the unfused torch layers (a CUDA host's
    Triton 3.6 runs the compiled kernels instead: test_cuda_kernels_and_dispatch)."""
    skip_old_interpreter()
    run_interpreted(__file__, case)


def test_cpu_dispatch_is_off():
    """On CPU the decoder never takes the small-batch path."""
    assert get_triton_gemv(torch.randn(1, 64), torch.randn(128, 64)) is None


@pytest.mark.gpu  # conftest skips it without a GPU (and never touches CUDA in the parent)
def test_cuda_kernels_and_dispatch(monkeypatch):
    """Compiled kernels (RNE bf16, IEEE float32) and the dispatch rule on a GPU."""
    from vllm.kernels import gemv

    for dtype in (torch.float32, torch.bfloat16):
        _kernel_cases(gemv, dtype, "cuda")
        _layer_cases(gemv, dtype, "cuda")  # bf16: 2% of 4.0 after four projections
    _wide_layer_case(gemv)
    small = torch.empty(2 * 1536, 576, dtype=torch.bfloat16, device="cuda")  # SmolLM2 gate_up
    big = torch.empty(2 * 4864, 896, dtype=torch.bfloat16, device="cuda")  # Qwen2.5-0.5B's
    assert get_triton_gemv(torch.empty(1, 576, device="cuda"), small) is gemv
    assert get_triton_gemv(torch.empty(2, 576, device="cuda"), small) is None
    assert get_triton_gemv(torch.empty(1, 896, device="cuda"), big) is None
    # Llama-3.1-8B: gate_up and o_proj both take the whole-row kernel, so the layer does;
    # a large gate_up beside a small o_proj (never measured) stays on cuBLAS
    x8 = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    gu8 = torch.empty(2 * 14336, 4096, dtype=torch.bfloat16, device="cuda")
    o8 = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
    assert get_triton_gemv(x8, gu8, o8) is gemv
    assert get_triton_gemv(x8, gu8, o8[:1024]) is None
    assert get_triton_gemv(x8.expand(2, 4096), gu8, o8) is None
    # lm_heads: 8B's (K = 4096) takes it, SmolLM2's (K = 576 < ROWS_MIN_K) does not
    assert get_triton_gemv(x8, torch.empty(128256, 4096, device="cuda")) is gemv
    assert get_triton_gemv(x8[:, :576], torch.empty(49152, 576, device="cuda")) is None
    assert not gemv.rows_kernel_fits(1000, 64)  # a tiny test head
    monkeypatch.setenv("VLLM_USE_TRITON_GEMV", "0")
    assert get_triton_gemv(torch.empty(1, 576, device="cuda"), small) is None


def test_l2_tiles_budget():
    """The whole-row kernel's L2 prefetch depth: the later tiles a program has, within the
    launch's byte budget, at most MAX_L2_TILES; 0 without a budget."""
    from vllm.kernels.gemv_rows import MAX_L2_TILES, l2_tiles

    tile = 2 * 4096 * 2  # Llama-3.1-8B o_proj: 2 outputs x K = 4096, bf16
    # o_proj on 132 SMs x 4 programs: 2048 tiles, 4 a program (3 after the register one)
    assert l2_tiles(2048, 528, tile, 0) == 0
    assert l2_tiles(2048, 528, tile, 8 << 20) == 0  # one tile-depth is 8.65 MB
    assert l2_tiles(2048, 528, tile, 16 << 20) == 1
    assert l2_tiles(2048, 528, tile, 1 << 30) == 3  # capped by the tiles it has
    assert l2_tiles(64, 528, tile, 1 << 30) == 0  # one tile a program: nothing later
    assert l2_tiles(1 << 20, 528, tile, 1 << 40) == MAX_L2_TILES


@pytest.mark.gpu
def test_cuda_l2_prefetch_changes_nothing(monkeypatch):
    """VLLM_TRITON_L2_PREFETCH_MB only prefetches: the whole-row kernel's outputs and
    residual sums are bit-identical with and without it (Llama-3.1-8B's projection shapes,
    bf16, plain and norm + residual + SiLU-and-mul), and the prefetch depth is nonzero."""
    from vllm.kernels import gemv
    from vllm.kernels.gemv_rows import cuda_sm_count, l2_tiles
    from vllm.kernels.pdl import pdl_enabled

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16)
    r = torch.randn(1, 4096, generator=gen).to("cuda", torch.bfloat16)
    nw = (torch.rand(4096, generator=gen) + 0.5).to("cuda", torch.bfloat16)
    o = (torch.randn(4096, 4096, generator=gen) / 64).to("cuda", torch.bfloat16)
    gu = (torch.randn(2 * 14336, 4096, generator=gen) / 64).to("cuda", torch.bfloat16)
    runs = {}
    for mb in ("0", "64"):
        monkeypatch.setenv("VLLM_TRITON_L2_PREFETCH_MB", mb)
        runs[mb] = (gemv.linear(x, o), *gemv.norm_linear(x, r, nw, EPS, gu, silu_mul=True))
    for want, got in zip(runs["0"], runs["64"]):
        assert torch.equal(want, got)
    if pdl_enabled(x):  # Hopper: the 64 MiB run prefetched
        programs = 4 * cuda_sm_count(x.device.index or 0)
        assert l2_tiles(2048, programs, 2 * 4096 * 2, 64 << 20) > 0
