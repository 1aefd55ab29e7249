"""Dynamic per-row fp8 quantization of activations in one Triton launch.

Why: the W8A8 path of ``--quantization fp8`` (vllm/model_executor/layers/fp8.py) quantizes
each projection's input rows before ``torch._scaled_mm``. As torch ops that is about six
kernels (abs, amax, division, float copy, clamp, cast) per projection, 768 a step for a
32-layer model: at 64 decode rows on an H100 they cost more than fp8 saved. Here one
program per row reads the row once, takes its absolute maximum and writes the e4m3 values
and the row's scale:

    scale[t] = max_k |x[t, k]| * (1 / 448)  (1 for a zero row),
    xq[t, k] = round_e4m3(clamp(x[t, k] / scale[t], -448, 448))

as ``fp8.quantize_rows_torch`` computes them, the division rounded to nearest as torch's
(``tl.div_rn``; Triton's ``/`` is approximate), so both give the same bits on a GPU.
(Triton 3.9's interpreter rounds some values to the wrong power of two when it converts
to fp8, so CPU tests check the scales only.) This module imports ``triton`` at the top:
reach it through :func:`vllm.kernels.dispatch.get_triton_fp8_quant`.
"""

import torch
import triton
import triton.language as tl

MAX_K = 1 << 16  # the widest row one program takes whole


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, x_stride, q_stride, fp8_max, inv_fp8_max,
                       BLOCK_K: tl.constexpr):  # fmt: skip
    """Row ``program_id(0)``: x [K] -> q [K] fp8 and s [1] float32."""
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)  # [BK]
    ok = ks < K
    x = tl.load(x_ptr + row * x_stride + ks, mask=ok, other=0.0).to(tl.float32)  # [BK]
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.where(amax > 0, amax * inv_fp8_max, 1.0)
    q = tl.clamp(tl.div_rn(x, scale), -fp8_max, fp8_max)  # [BK]
    tl.store(q_ptr + row * q_stride + ks, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row, scale)


def quantize_rows(
    x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, inv_fp8_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq [T, K] ``fp8_dtype``, scale [T, 1] float32) for activations ``x`` [T, K] on CUDA
    (or under the interpreter); ``fp8_max`` the format's largest value, ``inv_fp8_max``
    its reciprocal (the scale is ``amax * inv_fp8_max``).

    Raises:
        ValueError: ``x`` not 2-D, or K > MAX_K.
    """
    if x.dim() != 2 or x.shape[1] > MAX_K:
        raise ValueError(f"x must be [rows, K <= {MAX_K}], got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    t, k = x.shape
    xq = torch.empty((t, k), dtype=fp8_dtype, device=x.device)  # [T, K]
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)  # [T, 1]
    if t:
        block = triton.next_power_of_2(k)
        warps = max(4, min(16, block // 512))
        _quant_rows_kernel[(t,)](x, xq, scale, k, x.stride(0), xq.stride(0), float(fp8_max),
                                 float(inv_fp8_max), BLOCK_K=block, num_warps=warps)  # fmt: skip
    return xq, scale
