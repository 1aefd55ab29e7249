"""The small-batch projection kernels (vllm/kernels/gemv.py, gemv_rows.py) with fp8 weights
and per-row scales (``--quantization fp8``, vllm/model_executor/layers/fp8.py).

Reference: ``F.linear`` on the dequantized weight (``Wq.float() * scale``, rounded to the
activation dtype), after the unfused RMSNorm, then SiLU-and-mul. CPU: the kernels under
``TRITON_INTERPRET=1`` (the interpreter widens the fp8 weight to float32 first: numpy has
no fp8); tolerances as tests/kernels/test_gemv.py. GPU: the compiled kernels reading fp8,
and ``fp8_linear``'s three paths (GEMV, W8A8 ``torch._scaled_mm``, dequantized F.linear).
"""

import importlib.util
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_gemv import EPS, _tol
from tests.utils import run_interpreted, skip_old_interpreter
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    INV_FP8_MAX,
    dequantize,
    fp8_linear,
    quantize_weight,
)
from vllm.model_executor.layers.layernorm import RMSNorm

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)


@torch.no_grad()
def _fp8_cases(gemv: ModuleType, dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    act = SiluAndMul()
    n, k = 40, 300
    norm = RMSNorm(k, eps=EPS)
    norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    norm = norm.to(device=device, dtype=dtype)
    # rows of very different magnitudes: a wrong row's scale shows
    w = torch.randn(2 * n, k, generator=gen) * torch.logspace(-2, 1, 2 * n)[:, None] / k**0.5
    wq, scale = quantize_weight(w.to(device))
    deq = dequantize(wq, scale, dtype)  # [2N, K]
    b = torch.randn(2 * n, generator=gen).to(device=device, dtype=dtype)
    out_scale = 30.0  # the largest rows' outputs are about 10x those of unscaled ones
    configs = [None, dict(gemv.launch_config(1, 1 << 12, 1 << 12), BLOCK_N=4)]  # tiled, rows
    for m in (1, 2, 5, 16):
        x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        r = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        for cfg in configs if m == 1 else configs[:1]:
            ctx = f"fp8 dtype={dtype} M={m} cfg={cfg}"
            got, _ = gemv._launch(x, None, None, 0.0, wq, b, False, cfg, weight_scale=scale)
            assert got.dtype == dtype and got.shape == (m, 2 * n), ctx
            want = F.linear(x, deq, b)
            torch.testing.assert_close(
                got, want, **_tol(dtype, out_scale), msg=lambda e, c=ctx: c + e
            )
            got, _ = gemv._launch(x, r, norm.weight, EPS, wq, None, True, cfg, weight_scale=scale)
            normed, _ = norm.forward_native(x, r)
            want = act.forward_native(F.linear(normed, deq))
            torch.testing.assert_close(
                got, want, **_tol(dtype, out_scale), msg=lambda e, c=ctx: c + e
            )
    # the public entry points pass the scales: without them the result is far off
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    got = gemv.linear(x, wq, b, weight_scale=scale)
    torch.testing.assert_close(got, F.linear(x, deq, b), **_tol(dtype, out_scale))
    got, _ = gemv.norm_linear(x, None, norm.weight, EPS, wq, b, weight_scale=scale)
    torch.testing.assert_close(got, F.linear(norm.forward_native(x), deq, b), **_tol(dtype, 30))
    unscaled = gemv.linear(x, wq.float().to(dtype), b)
    assert not torch.allclose(unscaled, F.linear(x, deq, b), **_tol(dtype, out_scale))


def _check_fp8() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    from vllm.kernels import gemv

    assert isinstance(gemv._gemv_kernel, InterpretedFunction), "not interpreted"
    for dtype in (torch.float32, torch.bfloat16):
        _fp8_cases(gemv, dtype, "cpu")
    _quant_scales()


def _quant_scales() -> None:
    """The one-launch activation quantizer's row scales equal the torch ops' (the
    interpreter's fp8 conversion itself is off at some powers of two, so only the scales
    are compared here; the GPU test compares the values too)."""
    from vllm.kernels import fp8_quant
    from vllm.model_executor.layers import fp8

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, 300, generator=gen) * torch.logspace(-3, 2, 9)[:, None]
    x[5] = 0
    for dtype in (torch.float32, torch.bfloat16):
        _, s = fp8_quant.quantize_rows(x.to(dtype), FP8_DTYPE, FP8_MAX, INV_FP8_MAX)
        assert torch.equal(s, fp8.quantize_rows_torch(x.to(dtype))[1]), dtype


def test_interpreted_fp8():
    """fp8 weights with row scales through the tiled and the whole-row kernels, float32
    and bfloat16, under the interpreter vs the dequantized torch layers; the activation
    quantizer's scales."""
    skip_old_interpreter()
    run_interpreted(__file__, "_check_fp8")


def test_cpu_fp8_linear_is_dequantized_linear():
    """On CPU ``fp8_linear`` is F.linear on the dequantized weight, bit for bit (the
    engine's CPU equality with transformers on dequantized weights rests on it)."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(24, 40, generator=gen)
    wq, scale = quantize_weight(w)
    x = torch.randn(3, 40, generator=gen)
    b = torch.randn(24, generator=gen)
    assert torch.equal(fp8_linear(x, wq, scale, b), F.linear(x, dequantize(wq, scale, x.dtype), b))


@pytest.mark.gpu  # conftest skips it without a GPU (and never touches CUDA in the parent)
def test_cuda_fp8_kernels_and_paths():
    """The compiled kernels on fp8 weights, and fp8_linear's paths on CUDA: one row
    through the GEMV kernels, 32 rows through W8A8 ``torch._scaled_mm`` (activations
    quantized per row: within 3% of the output scale of the dequantized product), float16
    through the dequantized F.linear (close to float16 rounding); the one-launch
    activation quantizer equal to the torch ops."""
    from vllm.kernels import gemv
    from vllm.model_executor.layers import fp8

    for dtype in (torch.float32, torch.bfloat16):
        _fp8_cases(gemv, dtype, "cuda")
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(4096, 1024, generator=gen) / 32).cuda()
    wq, scale = quantize_weight(w)
    for rows, dtype in ((1, torch.bfloat16), (32, torch.bfloat16), (32, torch.float16)):
        x = torch.randn(rows, 1024, generator=gen).to("cuda", dtype)
        want = F.linear(x.float(), dequantize(wq, scale, torch.float32))  # [rows, 4096]
        got = fp8_linear(x, wq, scale, None)
        assert got.dtype == dtype and got.shape == (rows, 4096)
        rel = 3e-2 if rows == 32 and dtype == torch.bfloat16 else 1e-2
        torch.testing.assert_close(got.float(), want, rtol=rel, atol=rel * want.abs().max())
    # the one-launch activation quantizer gives the torch ops' bits (a zero row: scale 1)
    x = torch.randn(37, 4096, generator=gen) * torch.logspace(-3, 2, 37)[:, None]
    x[5] = 0
    x = x.to("cuda", torch.bfloat16)
    xq, s = fp8.quantize_rows(x)
    xq_ref, s_ref = fp8.quantize_rows_torch(x)
    assert torch.equal(s, s_ref) and s[5, 0] == 1.0
    assert torch.equal(xq.view(torch.uint8), xq_ref.view(torch.uint8))
    x32 = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    assert fp8.scaled_mm_fits(x32, wq) == (torch.cuda.get_device_capability() >= (8, 9))
    assert not fp8.scaled_mm_fits(x32.half(), wq)
