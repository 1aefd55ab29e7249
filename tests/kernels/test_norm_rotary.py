"""The fused Triton kernels (vllm/kernels/norm_rotary.py) vs the torch layers.

CPU: each ``*_interpreted`` test runs its checks in a fresh Python with
``TRITON_INTERPRET=1`` (``tests.utils.run_interpreted`` says why a subprocess), where
Triton's CPU interpreter executes the kernels. Reference:
the modules' ``forward_native`` (the torch code that runs on CPU); every kernel rounds at
torch's rounding points, so on the GPU bf16 results are (almost all) bit-identical.

The interpreter (triton 3.9, ``interpreter._convert_float``) casts float32 -> bfloat16 by
TRUNCATION, where the GPU rounds to nearest even as torch does; so on CPU the bf16 checks
allow one ulp, and only the GPU test demands torch's exact bits (``rne=True``).
GPU (``gpu`` marker): the same kernels compiled for CUDA, and the modules' dispatch.
Skipped with a reason when triton is not installed (requirements-test.txt pins it).
"""

import importlib.util
from types import ModuleType

import pytest
import torch

from tests.utils import run_interpreted
from vllm.kernels.dispatch import get_triton_ops
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

TOKENS = (1, 3, 37)
DTYPES = (torch.float32, torch.bfloat16)
EPS = 1e-5
MAX_POS = 4096
ROPE = {"rope_theta": 10000.0, "rope_type": "default"}
# (num_heads, num_kv_heads, head_dim, rotary_dim): SmolLM2-135M's attention, a small one,
# and a partial rotary as Phi-4-mini's (3/4 of each head; a half of 12 channels, not a
# power of two, and 8 channels that pass through unrotated).
HEADS = ((9, 3, 64, 64), (4, 2, 16, 16), (4, 2, 32, 24))


def _run_interpreted(case: str) -> None:
    run_interpreted(__file__, case)


def _interpreted_ops() -> ModuleType:
    """norm_rotary in a process started with TRITON_INTERPRET=1 (checked: not compiled)."""
    from triton.runtime.interpreter import InterpretedFunction

    from vllm.kernels import norm_rotary

    assert isinstance(norm_rotary._rms_norm_kernel, InterpretedFunction), "not interpreted"
    return norm_rotary


def _tol(dtype: torch.dtype) -> dict:
    """fp32: reduction order and rsqrt/exp ulps only; bf16: one ulp of a rounded result."""
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)


@torch.no_grad()
def _rms_cases(ops: ModuleType, dtype: torch.dtype, device: str, rne: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    for hidden in (576, 64):
        norm = RMSNorm(hidden, eps=EPS).to(device=device, dtype=dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(hidden, generator=gen) * 0.5 + 1)
        for t in TOKENS:
            # x is a column slice (row stride hidden + 8): exercises the row-stride argument.
            wide = (torch.randn(t, hidden + 8, generator=gen) * 3).to(device=device, dtype=dtype)
            x = wide[:, :hidden]  # [T, hidden], non-contiguous
            residual = torch.randn(t, hidden, generator=gen).to(device=device, dtype=dtype)
            ctx = f"dtype={dtype} hidden={hidden} T={t}"

            got = ops.rms_norm(x, norm.weight, EPS)
            want = norm.forward_native(x)
            assert got.dtype == dtype and got.shape == (t, hidden), ctx
            torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m, c=ctx: f"{c}: {m}")

            got_n, got_s = ops.fused_add_rms_norm(x, residual, norm.weight, EPS)
            want_n, want_s = norm.forward_native(x, residual)
            # The sum is one add rounded once in both: bit-identical (one ulp if truncated).
            if rne or dtype == torch.float32:
                assert torch.equal(got_s, want_s), ctx
            else:
                _assert_within_ulps(got_s, want_s.double(), 1.0, ctx)
            torch.testing.assert_close(
                got_n, want_n, **_tol(dtype), msg=lambda m, c=ctx: f"{c}: {m}"
            )
            if rne and dtype != torch.float32:  # same rounding points: mostly bit-identical
                assert (got_n == want_n).float().mean() > 0.9, ctx


@torch.no_grad()
def _silu_cases(ops: ModuleType, dtype: torch.dtype, device: str, rne: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    act = SiluAndMul()
    for d in (1536, 64):  # 1536 spans two 1024-wide blocks, the second one masked
        for t in TOKENS:
            wide = (torch.randn(t, 2 * d + 4, generator=gen) * 4).to(device=device, dtype=dtype)
            x = wide[:, : 2 * d]  # [T, 2d], non-contiguous rows
            ctx = f"dtype={dtype} d={d} T={t}"
            got = ops.silu_and_mul(x)
            want = act.forward_native(x)
            assert got.dtype == dtype and got.shape == (t, d), ctx
            torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m, c=ctx: f"{c}: {m}")
            if rne and dtype != torch.float32:  # same rounding points: mostly bit-identical
                assert (got == want).float().mean() > 0.9, ctx


def _assert_within_ulps(got: torch.Tensor, exact: torch.Tensor, ulps: float, ctx: str) -> None:
    """|got - exact| <= ulps * (bf16 ulp at |exact|); bf16 keeps 8 significant bits."""
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**-126))) - 7)
    err = (got.double() - exact).abs()
    assert (err <= ulps * ulp).all(), (ctx, (err / ulp).max().item())


def _pair_magnitude(
    qkv: torch.Tensor, start: int, width: int, head_dim: int, rotary_dim: int
) -> torch.Tensor:
    """|x1| + |x2| of the rotation pair behind each element of qkv[:, start : start + width];
    0 on the channels a partial rotary passes through (they must be exact)."""
    x = qkv[:, start : start + width].float().view(qkv.shape[0], -1, head_dim)  # [T, H, D]
    x1, x2 = x[..., :rotary_dim].chunk(2, dim=-1)  # [T, H, R / 2] each
    pair = x1.abs() + x2.abs()
    rest = torch.zeros_like(x[..., rotary_dim:])  # [T, H, D - R]
    return torch.cat((pair, pair, rest), dim=-1).view(x.shape[0], -1)  # [T, H * D]


@torch.no_grad()
def _rotary_cases(ops: ModuleType, dtype: torch.dtype, device: str, rne: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    for num_heads, num_kv_heads, head_dim, rotary_dim in HEADS:
        rope = RotaryEmbedding(head_dim, rotary_dim, MAX_POS, ROPE).to(device)
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        for t in TOKENS:
            ctx = f"dtype={dtype} heads={num_heads}/{num_kv_heads} D={head_dim}/{rotary_dim} T={t}"
            positions = torch.randint(0, MAX_POS, (t,), generator=gen).to(device)  # unsorted
            qkv = torch.randn(t, q_size + 2 * kv_size, generator=gen).to(device=device, dtype=dtype)
            before = qkv.clone()
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)  # column slices
            want_q, want_k = rope.forward_native(positions, q, k)  # out of place

            got_q, got_k = ops.rotary_embedding(positions, q, k, rope.cos_sin_cache, head_dim)
            # In place: the returned tensors are the qkv views; v is untouched.
            assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr(), ctx
            assert got_q.shape == (t, q_size) and got_k.shape == (t, kv_size), ctx
            assert got_q.dtype == dtype and got_k.dtype == dtype, ctx
            assert torch.equal(qkv[:, q_size + kv_size :], before[:, q_size + kv_size :]), ctx
            assert torch.equal(qkv[:, :q_size], got_q), ctx
            for got, want, start in ((got_q, want_q, 0), (got_k, want_k, q_size)):
                if rne:  # torch's rounding points, no FMA, no reduction: bit-identical
                    assert torch.equal(got, want), (ctx, (got.float() - want.float()).abs().max())
                elif dtype == torch.float32:
                    torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)
                else:  # truncating interpreter: about one ulp of |x1| + |x2| per rounding
                    bound = 2.0**-5 * _pair_magnitude(
                        before, start, got.shape[1], head_dim, rotary_dim
                    )
                    assert ((got.float() - want.float()).abs() <= bound).all(), ctx


@torch.no_grad()
def _rotary_cache_write_cases(ops: ModuleType, dtype: torch.dtype, device: str) -> None:
    """The fused cache write: rows of a FlashInfer-layout cache hold exactly the rotated
    key and the value (same kernel arithmetic as the in-place rotation; with a partial
    rotary the key's unrotated channels too), other rows stay zero; ``kv_rows`` may be a
    strided view (the graph state's [3, max_bs] buffer)."""
    from vllm.attention.backends.flashinfer.paged_cache import slot_rows_host, write_kv

    gen = torch.Generator().manual_seed(5)
    block_size, num_blocks = 16, 6
    for num_heads, num_kv_heads, head_dim, rotary_dim in HEADS:
        rope = RotaryEmbedding(head_dim, rotary_dim, MAX_POS, ROPE).to(device)
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        for t in TOKENS:
            ctx = f"dtype={dtype} heads={num_heads}/{num_kv_heads} D={head_dim}/{rotary_dim} T={t}"
            positions = torch.randint(0, MAX_POS, (t,), generator=gen).to(device)
            qkv = torch.randn(t, q_size + 2 * kv_size, generator=gen).to(device=device, dtype=dtype)
            slots = torch.randperm(num_blocks * block_size, generator=gen)[:t].tolist()
            slots[0] = -1  # a padded lane: the scratch slot
            rows3 = torch.zeros(3, t + 5, dtype=torch.long)
            rows3[:, :t] = slot_rows_host(slots, num_blocks * block_size, block_size)
            kv_rows = rows3.to(device)[1:, :t]  # [2, t], row stride t + 5
            shape = (num_blocks + 1, 2, block_size, num_kv_heads, head_dim)
            cache = torch.zeros(shape, dtype=dtype, device=device)
            want_cache = torch.zeros_like(cache)
            ref, before = qkv.clone(), qkv.clone()
            rq, rk, rv = ref.split([q_size, kv_size, kv_size], dim=-1)
            rq, rk = ops.rotary_embedding(positions, rq, rk, rope.cos_sin_cache, head_dim)
            write_kv(want_cache, rk.view(t, -1, head_dim), rv.view(t, -1, head_dim), kv_rows)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            flat = cache.view(-1, kv_size)
            got_q, got_k = ops.rotary_embedding(
                positions, q, k, rope.cos_sin_cache, head_dim, v, flat, kv_rows
            )
            assert torch.equal(got_q, rq) and torch.equal(got_k, rk), ctx
            assert torch.equal(cache, want_cache), ctx
            assert cache.abs().sum() > 0, ctx
            if rotary_dim < head_dim:  # the unrotated key channels reach the cache as given
                keys = flat[kv_rows[0]].view(t, num_kv_heads, head_dim)  # [T, kv_heads, D]
                given = before[:, q_size : q_size + kv_size].view(t, num_kv_heads, head_dim)
                assert torch.equal(keys[..., rotary_dim:], given[..., rotary_dim:]), ctx
    rope = RotaryEmbedding(16, 16, 32, ROPE).to(device)
    pos = torch.zeros(2, dtype=torch.long, device=device)
    q, k = torch.randn(2, 64, device=device), torch.randn(2, 32, device=device)
    rows = torch.zeros(2, 2, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="must be given together"):
        ops.rotary_embedding(pos, q, k, rope.cos_sin_cache, 16, k.clone(), None, rows)
    with pytest.raises(ValueError, match="differs from key dtype"):
        flat16 = torch.zeros(8, 32, dtype=torch.float16, device=device)
        ops.rotary_embedding(pos, q, k, rope.cos_sin_cache, 16, k.clone(), flat16, rows)


def _check_rotary_cache_write() -> None:
    for dtype in DTYPES:
        _rotary_cache_write_cases(_interpreted_ops(), dtype, "cpu")


def _check_rms_norm() -> None:
    for dtype in DTYPES:
        _rms_cases(_interpreted_ops(), dtype, "cpu", rne=False)


def _check_silu_and_mul() -> None:
    for dtype in DTYPES:
        _silu_cases(_interpreted_ops(), dtype, "cpu", rne=False)


def _check_rotary() -> None:
    for dtype in DTYPES:
        _rotary_cases(_interpreted_ops(), dtype, "cpu", rne=False)


def _check_empty_inputs_and_errors() -> None:
    ops = _interpreted_ops()
    w = torch.ones(64)
    assert ops.rms_norm(torch.empty(0, 64), w, EPS).shape == (0, 64)
    normed, s = ops.fused_add_rms_norm(torch.empty(0, 64), torch.empty(0, 64), w, EPS)
    assert normed.shape == s.shape == (0, 64)
    assert ops.silu_and_mul(torch.empty(0, 128)).shape == (0, 64)
    rope = RotaryEmbedding(16, 16, 32, ROPE)
    q, k = ops.rotary_embedding(
        torch.empty(0, dtype=torch.long), torch.empty(0, 64), torch.empty(0, 32),
        rope.cos_sin_cache, 16,
    )  # fmt: skip
    assert q.shape == (0, 64) and k.shape == (0, 32)
    with pytest.raises(ValueError, match="even last dimension, got 7"):
        ops.silu_and_mul(torch.empty(2, 7))
    with pytest.raises(ValueError, match="multiples of head_size 16"):
        ops.rotary_embedding(
            torch.zeros(2, dtype=torch.long), torch.empty(2, 40), torch.empty(2, 32),
            rope.cos_sin_cache, 16,
        )  # fmt: skip
    for width in (18, 7):  # wider than the head, odd
        with pytest.raises(ValueError, match=rf"width \(rotary_dim\) {width} must be even and "
                                             r"in \[2, head_size=16\]"):  # fmt: skip
            ops.rotary_embedding(
                torch.zeros(2, dtype=torch.long), torch.empty(2, 64), torch.empty(2, 32),
                torch.zeros(32, width), 16,
            )  # fmt: skip


def _check_wrong_formulas_are_caught() -> None:
    """The tolerances reject plausible kernel bugs: a flipped sin sign (inverse rotation),
    swapped gate/up halves, a missing weight multiply."""
    ops = _interpreted_ops()
    gen = torch.Generator().manual_seed(3)
    rope = RotaryEmbedding(64, 64, MAX_POS, ROPE)
    pos = torch.randint(1, MAX_POS, (3,), generator=gen)
    q, k = torch.randn(3, 9 * 64, generator=gen), torch.randn(3, 3 * 64, generator=gen)
    want_q, _ = rope.forward_native(pos, q, k)
    cos, sin = rope.cos_sin_cache.chunk(2, dim=-1)
    inverse = torch.cat((cos, -sin), dim=-1)  # [max_pos, 64]
    bad_q, _ = ops.rotary_embedding(pos, q.clone(), k.clone(), inverse, 64)
    assert not torch.allclose(bad_q, want_q, rtol=1e-6, atol=2e-6)

    x = torch.randn(3, 2 * 64, generator=gen)
    swapped = torch.cat((x[:, 64:], x[:, :64]), dim=-1)
    assert not torch.allclose(ops.silu_and_mul(swapped), SiluAndMul().forward_native(x))

    norm = RMSNorm(64, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, generator=gen) + 0.5)
    h = torch.randn(3, 64, generator=gen)
    assert not torch.allclose(ops.rms_norm(h, torch.ones(64), EPS), norm.forward_native(h))


@pytest.mark.parametrize(
    "case",
    [
        "_check_rms_norm",
        "_check_silu_and_mul",
        "_check_rotary",
        "_check_rotary_cache_write",
        "_check_empty_inputs_and_errors",
        "_check_wrong_formulas_are_caught",
    ],
)
def test_interpreted(case):
    """float32 and bfloat16, T in (1, 3, 37), under the interpreter vs the torch layers."""
    _run_interpreted(case)


def test_cpu_dispatch_runs_torch_code():
    """On CPU the modules take the torch path: bit-identical to forward_native."""
    x = torch.randn(5, 64)
    assert get_triton_ops(x) is None
    norm = RMSNorm(64)
    assert torch.equal(norm(x), norm.forward_native(x))
    assert torch.equal(SiluAndMul()(x), SiluAndMul().forward_native(x))
    rope = RotaryEmbedding(16, 16, 32, ROPE)
    pos = torch.tensor([3, 0, 31, 7, 7])
    q, k = torch.randn(5, 64), torch.randn(5, 32)
    q0, k0 = q.clone(), k.clone()
    for got, want in zip(rope(pos, q, k), rope.forward_native(pos, q, k), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # the torch path is out of place


@pytest.mark.gpu
@pytest.mark.forked
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_on_cuda(dtype, monkeypatch):
    """Compiled kernels vs the torch layers on the GPU, and the module dispatch rule."""
    import triton

    monkeypatch.delenv("VLLM_USE_TRITON_OPS", raising=False)
    ops = get_triton_ops(torch.empty(1, device="cuda"))
    assert ops is not None, "triton did not import on a CUDA host"
    assert isinstance(ops._rms_norm_kernel, triton.runtime.JITFunction), "TRITON_INTERPRET is set"
    _rms_cases(ops, dtype, "cuda", rne=True)
    _silu_cases(ops, dtype, "cuda", rne=True)
    _rotary_cases(ops, dtype, "cuda", rne=True)
    _rotary_cache_write_cases(ops, dtype, "cuda")

    # Dispatch: the Triton rotary writes in place, the torch one does not.
    rope = RotaryEmbedding(64, 64, MAX_POS, ROPE).cuda()
    pos = torch.tensor([5, 0, 9], device="cuda")
    q = torch.randn(3, 9 * 64, device="cuda", dtype=dtype)
    k = torch.randn(3, 3 * 64, device="cuda", dtype=dtype)
    q0 = q.clone()
    monkeypatch.setenv("VLLM_USE_TRITON_OPS", "0")
    rope(pos, q, k)
    assert torch.equal(q, q0)
    monkeypatch.setenv("VLLM_USE_TRITON_OPS", "1")
    got_q, _ = rope(pos, q, k)
    assert got_q.data_ptr() == q.data_ptr() and not torch.equal(q, q0)
    norm = RMSNorm(576).to(device="cuda", dtype=dtype)
    x = torch.randn(7, 576, device="cuda", dtype=dtype)
    torch.testing.assert_close(norm(x), norm.forward_native(x), **_tol(dtype))
