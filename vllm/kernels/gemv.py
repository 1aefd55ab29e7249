"""Small-batch projections as Triton GEMV kernels, with the decoder's neighbours fused in.

Why: at decode with few sequences every projection of a decoder layer is a matrix-vector
product bound by launch latency (SmolLM2-135M) or by weight bytes (Llama-3.1-8B), and each
RMSNorm / SiLU-and-mul between two projections is one more launch and one more round trip
of the activations. For ``T <= MAX_ROWS`` rows one kernel here does (the decoder uses them
where they measured faster than cuBLAS: one row and small weights, see FUSED_MAX_ROWS):

- :func:`norm_linear`: ``[s = residual + x]`` -> RMSNorm -> ``@ W.T (+ bias)``, i.e. a
  layer's ``input_layernorm`` + ``qkv_proj``;
- :func:`norm_linear` with ``silu_mul=True``: the same, then ``silu(gate) * up`` on the two
  halves of ``W`` (``post_attention_layernorm`` + ``gate_up_proj`` + the activation);
- :func:`linear`: ``x @ W.T (+ bias)`` (``o_proj``, ``down_proj``).

A decoder layer then takes 4 kernels for its projections instead of 7 (norm, qkv, o,
norm, gate_up, act, down). One row through a large weight (ROWS_MIN_ELEMENTS, ROWS_MIN_K:
the Llama-3.1-8B projections and lm_head) takes the persistent whole-row kernel of
:mod:`gemv_rows` instead (same functions, same rounding points; ``launch_config``
picks it), which reads weights at 3.7-4.5 TB/s where cuBLAS GEMV reaches 2.5-4.2.

Layout: one program per ``BLOCK_N`` output features, all rows
in it, so each weight element is read once per step. Every program recomputes the row
norms from ``x`` (``K`` elements per row: a few KiB read from L2, against ``BLOCK_N * K``
weight elements); program 0 alone writes the residual sum.

Rounding follows the unfused torch layers (``RMSNorm.forward_native``, ``F.linear``,
``SiluAndMul.forward_native``): the residual sum, the normed row, the norm-weight product,
each projection output and the SiLU are rounded to the activation dtype where torch rounds
them; products accumulate in float32. float32 models use IEEE float32 products (no TF32),
so a float32 run keeps TF32 off as the exact GPU comparisons require (docs/design.md).
The accumulation order differs from cuBLAS: bf16 results differ from the unfused layers in
the last bit now and then (GPU bf16 comparisons use ``check_logprobs_close``). A row's
result does not depend on the other rows of a launch with the same ``BLOCK_M`` (tested),
and a replayed graph runs the same kernel as an eager step of the same size, so graphs
and --enforce-eager stay exact.

This module imports ``triton`` at the top: reach it through
:func:`vllm.kernels.dispatch.get_triton_gemv`.
"""

import torch
import triton
import triton.language as tl

from vllm import envs
from vllm.kernels import gemv_rows
from vllm.kernels.pdl import launch_options, pdl_enabled, pdl_wait

MAX_ROWS = 16  # the most rows the kernels accept (one 16-row tl.dot tile)
_DOT_MIN_ROWS = 5  # rows from which tensor-core tl.dot (16-row tiles) replaces FMA sums
# When the decoder uses them (benchmarks/kernel_gemv.py on an H200, bf16, graph replays):
# at 1 row SmolLM2's four projections take 17.3 us per layer against 20.6 us for cuBLAS
# plus the separate norm and SiLU kernels; at 8 rows 18.8 against 20.3 us (not worth a
# second code path); for the Llama-3.1-8B shapes, which are bandwidth-bound, cuBLAS is
# 1.2-1.5x faster at one row and within 15% at 8. Hence: one row, gate_up <= 8 MiB.
FUSED_MAX_ROWS = 1
FUSED_MAX_WEIGHT_BYTES = 8 << 20
# One row of a large weight (>= 16M elements, K >= 1024: every Llama-3.1-8B projection
# and lm_head) is bandwidth-bound: the persistent whole-row kernel of gemv_rows.
# benchmarks/kernel_gemv.py --grid rows on an H200 (bf16, 8B shapes, one row, graph
# replays; cuBLAS with the separate norm / SiLU kernels in brackets): qkv 13.7 us (17.7),
# o 8.6 (13.3), gate_up 54.7 (60.6), down 29.6 (32.3), lm_head 233 (248); 3.7-4.5 TB/s
# against a 4.59 TB/s read ceiling. Best: 2 outputs a tile, 8 warps, 4 programs an SM
# (K = 4096); 16 warps, 2 an SM for K = 14336.
# One row of a small weight: 4 output features x the whole row (K <= 2048) per program.
# The small path's layer chain (the decoder layer as separate kernels, 30
# SmolLM2 layers in a graph, one H200, bf16, us per layer at contexts 192 / 1024):
# 8 x 512 (K = 576 then takes a second tile, read after the wait) 20.82 /
# 21.34; 8 x whole K 17.08; 4 x whole K 16.57 / 17.97; 2 x whole K 16.73 / 18.27; 8 warps
# instead of 4: 18.2-18.6.
ONE_ROW_BLOCK_N = 4
ONE_ROW_MAX_BLOCK_K = 2048
ROWS_MIN_ELEMENTS = 1 << 24
ROWS_MIN_K = 1024
ROWS_BLOCK_N = 2
_INTERPRETED = envs.TRITON_INTERPRET  # read once, as triton does


@triton.jit
def _row_products(a, w, USE_DOT: tl.constexpr, IEEE: tl.constexpr):
    """a [BM, BK] @ w [BN, BK].T -> [BM, BN] float32.

    USE_DOT: a tensor-core ``tl.dot`` (16-row tiles); else FMA products summed over BK.
    IEEE: float32 products without TF32. Under ``TRITON_INTERPRET=1`` (CPU tests) the dot
    takes float32 copies, since the interpreter's bfloat16 ``tl.dot`` returns garbage
    (triton 3.9); a bf16 x bf16 product is exact in float32, so only the summation order
    can differ from the GPU's.
    """
    if USE_DOT:
        if IEEE:  # float32 operands (the casts are no-ops but under the interpreter)
            return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        return tl.dot(a, tl.trans(w))
    prod = a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]  # [BM, BN, BK]
    return tl.sum(prod, axis=2)


@triton.jit
def _w_tile(w_ptr, tile, N, K, w_stride, up_offset, SILU_MUL: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """The first [BLOCK_N, BLOCK_K] weight tile of output tile ``tile`` (and of its ``up``
    half with SILU_MUL); all-masked past N. Weights are never written during a step, so a
    caller may load this before waiting for earlier kernels (PDL) or programs."""
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output features
    ks = tl.arange(0, BLOCK_K)  # [BK]
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride  # [BN, 1]
    w_ok = (cols < N)[:, None] & (ks < K)[None, :]  # [BN, BK]
    w = tl.load(w_rows + ks[None, :], mask=w_ok, other=0.0)  # [BN, BK]
    wu = w
    if SILU_MUL:
        wu = tl.load(w_rows + up_offset * w_stride + ks[None, :], mask=w_ok, other=0.0)
    return w, wu


@triton.jit
def _gemv_tile(
    tile, w_next, wu_next, x_ptr, res_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, out_ptr, res_out_ptr,
    M, N, K, x_stride, res_stride, w_stride, out_stride, res_out_stride, up_offset, eps,
    NORM: tl.constexpr, ADD_RES: tl.constexpr, SILU_MUL: tl.constexpr, HAS_BIAS: tl.constexpr,
    W_SCALE: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[:, tile * BLOCK_N : (tile + 1) * BLOCK_N] for all M (<= BLOCK_M) rows, given the
    tile's first weight tile(s) from :func:`_w_tile`; each later weight tile is loaded an
    iteration ahead of its use. The program of tile 0 alone stores the residual sum.
    W_SCALE: fp8 weights with per-row scales ``s_ptr`` [N] ([2 * N] with SILU_MUL),
    widened to the activation dtype (exact) and scaled after the float32 sums."""
    rows = tl.arange(0, BLOCK_M)  # [BM]
    row_ok = rows < M
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output features
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)  # [BK]
    act_ty = out_ptr.dtype.element_ty
    x_rows = x_ptr + rows[:, None].to(tl.int64) * x_stride  # [BM, 1]
    r_rows = res_ptr + rows[:, None].to(tl.int64) * res_stride
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride  # [BN, 1]

    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:  # pass 1: mean square of each row of s = residual + x
        sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            m2 = row_ok[:, None] & (kk < K)[None, :]  # [BM, BK]
            a = tl.load(x_rows + kk[None, :], mask=m2, other=0.0)
            a = a.to(tl.float32)
            if ADD_RES:
                r = tl.load(r_rows + kk[None, :], mask=m2, other=0.0)
                s = (r.to(tl.float32) + a).to(res_out_ptr.dtype.element_ty)  # `residual + x`
                dst = res_out_ptr + rows[:, None].to(tl.int64) * res_out_stride + kk[None, :]
                if tile == 0:  # one program stores the residual sum
                    tl.store(dst, s, mask=m2)
                a = s.to(tl.float32)
            sumsq += tl.sum(a * a, axis=1)
        rstd = tl.rsqrt(sumsq / K + eps)  # [BM]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 2: the products
        kk = k0 + ks
        k_ok = kk < K
        m2 = row_ok[:, None] & k_ok[None, :]
        a = tl.load(x_rows + kk[None, :], mask=m2, other=0.0)  # [BM, BK]
        if NORM:
            a = a.to(tl.float32)
            if ADD_RES:
                r = tl.load(r_rows + kk[None, :], mask=m2, other=0.0)
                a = (r.to(tl.float32) + a).to(res_out_ptr.dtype.element_ty).to(tl.float32)
            # HF LlamaRMSNorm: normalise in float32, round, then the weight multiply
            a = (a * rstd[:, None]).to(act_ty).to(tl.float32)
            nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)  # [BK]
            a = (nw[None, :] * a).to(act_ty)
        a = a.to(act_ty if W_SCALE else w_ptr.dtype.element_ty)
        w, wu = w_next, wu_next  # [BN, BK] this tile; load the next one now
        kn = kk + BLOCK_K
        wn_ok = col_ok[:, None] & (kn < K)[None, :]  # all False after the last tile
        w_next = tl.load(w_rows + kn[None, :], mask=wn_ok, other=0.0)
        if SILU_MUL:
            wu_next = tl.load(w_rows + up_offset * w_stride + kn[None, :], mask=wn_ok, other=0.0)
        if W_SCALE:  # e4m3 -> the activation dtype: exact
            w = w.to(act_ty)
            wu = wu.to(act_ty)
        acc += _row_products(a, w, USE_DOT, IEEE)
        if SILU_MUL:
            acc_up += _row_products(a, wu, USE_DOT, IEEE)

    if W_SCALE:
        acc *= tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
        if SILU_MUL:
            acc_up *= tl.load(s_ptr + up_offset + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            up_b = tl.load(b_ptr + up_offset + cols, mask=col_ok, other=0.0)
            acc_up += up_b.to(tl.float32)[None, :]
    if SILU_MUL:  # gate and up rounded as the projection's output, then F.silu, then *
        gate = acc.to(act_ty).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(act_ty).to(tl.float32)
        y = (silu * acc_up.to(act_ty).to(tl.float32)).to(act_ty)
    else:
        y = acc.to(act_ty)
    dst = out_ptr + rows[:, None].to(tl.int64) * out_stride + cols[None, :]
    tl.store(dst, y, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gemv_kernel(
    x_ptr, res_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, out_ptr, res_out_ptr,
    M, N, K, x_stride, res_stride, w_stride, out_stride, res_out_stride, up_offset, eps,
    NORM: tl.constexpr, ADD_RES: tl.constexpr, SILU_MUL: tl.constexpr, HAS_BIAS: tl.constexpr,
    W_SCALE: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Program n: output tile n (:func:`_gemv_tile`). The first weight tile is loaded before
    ``pdl_wait`` (weights are never written during a step)."""
    pid = tl.program_id(0)
    w, wu = _w_tile(w_ptr, pid, N, K, w_stride, up_offset, SILU_MUL, BLOCK_N, BLOCK_K)
    pdl_wait(PDL)  # everything below may read what earlier kernels wrote
    _gemv_tile(
        pid, w, wu, x_ptr, res_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, out_ptr, res_out_ptr,
        M, N, K, x_stride, res_stride, w_stride, out_stride, res_out_stride, up_offset, eps,
        NORM, ADD_RES, SILU_MUL, HAS_BIAS, W_SCALE, USE_DOT, IEEE, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip


def rows_kernel_fits(n: int, k: int) -> bool:
    """Whether one row through an [n, k] weight takes the persistent whole-row kernel
    (:mod:`gemv_rows`): >= ROWS_MIN_ELEMENTS elements and k >= ROWS_MIN_K."""
    return n * k >= ROWS_MIN_ELEMENTS and k >= ROWS_MIN_K


def small_weights(*weights: torch.Tensor) -> bool:
    """Whether every weight is <= FUSED_MAX_WEIGHT_BYTES: one row through them runs the
    tiled kernel (latency-bound)."""
    return all(w.numel() * w.element_size() <= FUSED_MAX_WEIGHT_BYTES for w in weights)


def worthwhile(rows: int, *weights: torch.Tensor) -> bool:
    """Whether ``rows`` tokens through projections ``weights`` (a decoder layer's largest
    and smallest, or one lm_head) should run here rather than cuBLAS: one row, and either
    every weight <= FUSED_MAX_WEIGHT_BYTES (latency-bound, the tiled kernel) or every one
    large enough for the whole-row kernel (bandwidth-bound); a mix, never measured, stays
    on cuBLAS. Measurements: the comments at FUSED_MAX_ROWS and ROWS_MIN_ELEMENTS."""
    if rows > FUSED_MAX_ROWS:
        return False
    return small_weights(*weights) or all(rows_kernel_fits(*w.shape) for w in weights)


def launch_config(rows: int, n: int, k: int) -> dict:
    """Block sizes and launch options for ``rows`` x ``k`` @ ``k`` x ``n``.

    Chosen by sweeps on an H200 (bf16). One row of a small weight: ONE_ROW_BLOCK_N output
    features x all of K (up to ONE_ROW_MAX_BLOCK_K) per program, 4 warps, so a program's
    whole weight tile is read before its PDL wait and nothing but the activations is read
    after it (see ONE_ROW_BLOCK_N). At 2-4 rows 8 x 512 / rows, at 5+ (tl.dot) 16 x 256
    (benchmarks/kernel_gemv.py). One row of a large weight gets the whole-row kernel's
    config (a dict with ``PERSIST``; see ROWS_BLOCK_N).
    """
    if rows >= _DOT_MIN_ROWS:
        return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, num_warps=4,
                    num_stages=4)  # fmt: skip
    if rows == 1 and rows_kernel_fits(n, k):
        # <= 32 weight elements a thread per tile (next_power_of_2(k) * BLOCK_N of them),
        # 4 to 16 warps, and 32 warps of programs per SM
        warps = max(4, min(16, triton.next_power_of_2(k) * ROWS_BLOCK_N // (32 * 32)))
        return dict(PERSIST=32 // warps, BLOCK_N=ROWS_BLOCK_N, num_warps=warps)
    if rows == 1:  # the whole weight row in one tile, loaded before the PDL wait
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=ONE_ROW_BLOCK_N,
                    BLOCK_K=min(triton.next_power_of_2(k), ONE_ROW_MAX_BLOCK_K), num_warps=4,
                    num_stages=4)  # fmt: skip
    block_m = triton.next_power_of_2(max(rows, 1))
    return dict(USE_DOT=False, BLOCK_M=block_m, BLOCK_N=8, BLOCK_K=512 // block_m,
                num_warps=4, num_stages=4)  # fmt: skip


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    k = weight.shape[1]
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [rows, {k}], got {tuple(x.shape)}")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"{x.shape[0]} rows > MAX_ROWS={MAX_ROWS}; use F.linear")
    if weight.stride(1) != 1:
        raise ValueError(f"weight must have unit column stride, got {weight.stride()}")


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
    eps: float, weight: torch.Tensor, bias: torch.Tensor | None, silu_mul: bool,
    config: dict | None = None, weight_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Shared launcher; returns (out [M, N_out], residual sum [M, K] or x).
    ``weight_scale``: [N] float32 row scales of an fp8 ``weight`` (else None)."""
    _check(x, weight)
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    # an fp8 weight does not take part in the promotion (torch has none for float8)
    act_dtype = x.dtype if weight_scale is not None else torch.promote_types(x.dtype, weight.dtype)
    if norm_weight is not None:
        act_dtype = torch.promote_types(act_dtype, norm_weight.dtype)
    res_out = x
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        residual = residual if residual.stride(1) == 1 else residual.contiguous()
        res_out = torch.empty(x.shape, dtype=torch.promote_types(residual.dtype, x.dtype),
                              device=x.device)  # fmt: skip
    out = torch.empty((m, n), dtype=act_dtype, device=x.device)  # [M, N_out]
    if m == 0:
        return out, res_out
    cfg = dict(config or launch_config(m, n, k))
    if "PERSIST" in cfg:  # one row of a large weight
        if m != 1:
            raise ValueError(f"the whole-row config {cfg} takes one row, got {m}")
        gemv_rows.launch(x, residual, norm_weight, eps, weight, bias, silu_mul, out,
                         res_out, cfg, weight_scale)  # fmt: skip
        return out, res_out
    # float32 products without TF32 where the tile's operands are float32
    ieee = (act_dtype if weight_scale is not None else weight.dtype) == torch.float32
    if _INTERPRETED and weight_scale is not None:  # numpy, under the interpreter, has no fp8
        weight = weight.float()
    if _INTERPRETED and cfg["USE_DOT"]:  # see _row_products
        x, weight, ieee = x.float(), weight.float(), True
    grid = (triton.cdiv(n, cfg["BLOCK_N"]),)
    pdl = pdl_enabled(x)
    _gemv_kernel[grid](
        x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else weight, weight,
        weight_scale if weight_scale is not None else out,
        bias if bias is not None else weight, out, res_out,
        m, n, k, x.stride(0), residual.stride(0) if residual is not None else 0,
        weight.stride(0), out.stride(0), res_out.stride(0), n, float(eps),
        NORM=norm_weight is not None, ADD_RES=residual is not None, SILU_MUL=silu_mul,
        HAS_BIAS=bias is not None, W_SCALE=weight_scale is not None, IEEE=ieee, PDL=pdl,
        **cfg, **launch_options(pdl),
    )  # fmt: skip
    return out, res_out


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``F.linear(x, weight, bias)`` for few rows, in one launch.

    Args:
        x: [M, K] on CUDA, M <= MAX_ROWS, unit column stride (else copied).
        weight: [N, K] (nn.Linear layout); bias: [N] or None.
        weight_scale: [N] float32 row scales of a float8_e4m3fn ``weight``
            (vllm/model_executor/layers/fp8.py): ``weight`` stands for
            ``weight.float() * weight_scale[:, None]``; None for a plain weight.

    Returns:
        [M, N] in ``promote_types(x.dtype, weight.dtype)`` (x's dtype for fp8 weights).

    Raises:
        ValueError: M > MAX_ROWS or K mismatch.
    """
    return _launch(x, None, None, 0.0, weight, bias, False, weight_scale=weight_scale)[0]


def norm_linear(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None = None, silu_mul: bool = False,
    weight_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``RMSNorm(x [+ residual]) @ weight.T (+ bias)`` [then SiLU-and-mul], in one launch.

    Args:
        x, residual: [M, K] on CUDA (M <= MAX_ROWS); ``residual`` None for a decoder's
            first layer (no skip add).
        norm_weight: [K], the RMSNorm weight; ``eps`` its epsilon (HF ``LlamaRMSNorm``).
        weight: [N, K]; with ``silu_mul`` the fused [gate | up] matrix [2 * N, K].
        bias: [N] (or [2 * N] with ``silu_mul``) or None.
        weight_scale: row scales of an fp8 ``weight`` (see :func:`linear`), or None.

    Returns:
        (out, s): out [M, N] (``silu(gate) * up`` with ``silu_mul``) in the activation
        dtype; s = residual + x [M, K] (the next residual), or ``x`` itself when
        ``residual`` is None. Same values as ``RMSNorm.forward_native`` then ``F.linear``
        (then ``SiluAndMul``) up to float32 summation order.

    Raises:
        ValueError: M > MAX_ROWS, shape mismatches, or an odd weight height with silu_mul.
    """
    if silu_mul and weight.shape[0] % 2:
        raise ValueError(f"silu_mul needs an even weight height, got {weight.shape[0]}")
    return _launch(x, residual, norm_weight, eps, weight, bias, silu_mul,
                   weight_scale=weight_scale)  # fmt: skip
