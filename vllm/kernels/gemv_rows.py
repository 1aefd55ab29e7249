"""One-row projections of large weights as a persistent Triton kernel over whole rows of K.

Why: at one decode token a Llama-3.1-8B projection streams 33-235 MB of weights and is
bound by memory bandwidth. :mod:`gemv`'s tiled kernel runs one short program per
``BLOCK_N`` outputs; with the RMSNorm fused in, each program re-reads x, the residual and
the norm weight from L2 (about as many bytes as its weights) and waits a norm pass before
its products, and between two programs of an SM nothing is in flight. Here (one row only):

- a program covers ALL of K at once (``BLOCK_K = next_power_of_2(K)``, so K fits one tile);
- the grid is persistent (``PERSIST`` programs per SM, each taking output tiles ``pid``,
  ``pid + nprog``, ...), and a program loads its next tile's weights before it computes on
  the current one, so weight loads stay in flight across tiles;
- the norm runs once per program: x (+ residual) is read once, normed in registers and
  kept there for every tile.

Arithmetic and rounding points are those of :func:`gemv._gemv_tile`'s two-pass norm
(``RMSNorm.forward_native``: residual sum, normed row and norm-weight product rounded to
the activation dtype; float32 products; gate, up and SiLU rounded as torch does), so this
kernel and :mod:`gemv` agree up to float32 summation order.

PDL contract (:mod:`pdl`): the first weight tile is loaded before ``pdl_wait``. With PDL a
program also asks the L2 cache for its next ``L2_TILES`` tiles before the wait
(:func:`l2_tiles`, ``VLLM_TRITON_L2_PREFETCH_MB``): weights only, no registers held, so a
projection that follows a latency-bound kernel (``o_proj`` after decode attention) or the
drain of a bandwidth-bound one streams part of its weights while that kernel runs, and reads
them from L2 after its wait. The results do not change (a prefetch moves no data into
registers).
Imports ``triton`` at the top; :mod:`gemv` launches it when a launch config asks for it
(``PERSIST`` in the config).
"""

import functools

import torch
import triton
import triton.language as tl

from vllm import envs
from vllm.kernels.pdl import launch_options, pdl_enabled, pdl_wait

MAX_L2_TILES = 8  # the most tiles a program prefetches into L2 (the loop is unrolled)
L2_LINE_BYTES = 128  # one prefetch instruction brings one 128-byte cache line


@functools.cache
def cuda_sm_count(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device ``device_index`` (cached): the unit of the
    persistent grid."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _rows_tile(w_ptr, tile, N, K, w_stride, up_offset, SILU_MUL: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Weights [BLOCK_N, BLOCK_K] of output tile ``tile`` (and its ``up`` half with
    SILU_MUL); all-masked past N (a prefetch past the program's last tile)."""
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    rows = w_ptr + cols[:, None].to(tl.int64) * w_stride + ks[None, :]  # [BN, BK]
    ok = (cols < N)[:, None] & (ks < K)[None, :]
    w = tl.load(rows, mask=ok, other=0.0)
    wu = w
    if SILU_MUL:
        wu = tl.load(rows + up_offset * w_stride, mask=ok, other=0.0)
    return w, wu


@triton.jit
def _prefetch_l2(ptrs):
    """Ask the L2 cache for the 128-byte lines holding ``ptrs`` (any shape): PTX
    ``prefetch.global.L2``; nothing is loaded into registers or returned. CUDA only (the
    interpreter has no inline assembly: callers pass ``L2_TILES = 0`` there)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _l2_tiles(w_ptr, pid, nprog, N, K, w_stride, up_offset, SILU_MUL: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINE: tl.constexpr,
              L2_TILES: tl.constexpr):  # fmt: skip
    """Prefetch into L2 the weights of this program's output tiles ``pid + j * nprog``,
    j = 1 .. L2_TILES (those past N skipped): one line of ``LINE`` elements at a time."""
    ks = tl.minimum(tl.arange(0, BLOCK_K // LINE) * LINE, K - 1)  # [BK / LINE] line starts
    for j in tl.static_range(1, L2_TILES + 1):
        tile = pid + j * nprog
        if tile * BLOCK_N < N:
            cols = tl.minimum(tile * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)  # [BN]
            lines = w_ptr + cols[:, None].to(tl.int64) * w_stride + ks[None, :]  # [BN, BK/LINE]
            _prefetch_l2(lines)
            if SILU_MUL:
                _prefetch_l2(lines + up_offset * w_stride)


@triton.jit
def _rows_kernel(
    x_ptr, res_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, out_ptr, res_out_ptr, N, K, w_stride,
    up_offset, eps, NORM: tl.constexpr, ADD_RES: tl.constexpr, SILU_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr, W_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, LINE: tl.constexpr, L2_TILES: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """See the module docstring. x, residual, res_out: [K] (one row); out: [N].
    W_SCALE: fp8 weights with row scales ``s_ptr`` (as :func:`gemv._gemv_tile`).
    L2_TILES: later tiles prefetched into L2 before the wait (:func:`l2_tiles`); LINE:
    weight elements per cache line."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    act_ty = out_ptr.dtype.element_ty
    w, wu = _rows_tile(w_ptr, pid, N, K, w_stride, up_offset, SILU_MUL, BLOCK_N, BLOCK_K)
    if L2_TILES > 0:
        _l2_tiles(w_ptr, pid, nprog, N, K, w_stride, up_offset, SILU_MUL, BLOCK_N, BLOCK_K,
                  LINE, L2_TILES)  # fmt: skip
    pdl_wait(PDL)  # below: reads of what earlier kernels wrote
    ks = tl.arange(0, BLOCK_K)[None, :]  # [1, BK]: the weight tile's layout, broadcast
    k_ok = ks < K
    a = tl.load(x_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)  # [1, BK]
    if NORM:
        if ADD_RES:
            r = tl.load(res_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            s = (r + a).to(res_out_ptr.dtype.element_ty)  # `residual + x`, rounded
            if pid == 0:  # one program stores the residual sum
                tl.store(res_out_ptr + ks, s, mask=k_ok)
            a = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(a * a, axis=1) / K + eps)  # [1]
        a = (a * rstd[:, None]).to(act_ty).to(tl.float32)  # HF LlamaRMSNorm: round, weight
        nw = tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        a = (nw * a).to(act_ty)
    # [1, BK], held for every tile in the weight's 16-bit dtype (half the registers of
    # float32); with fp8 weights in the activation dtype
    a = a.to(act_ty if W_SCALE else w_ptr.dtype.element_ty)
    for tile in range(pid, tl.cdiv(N, BLOCK_N), nprog):
        w_cur, wu_cur = w, wu  # this tile; the next one's loads go out first
        w, wu = _rows_tile(w_ptr, tile + nprog, N, K, w_stride, up_offset, SILU_MUL,
                           BLOCK_N, BLOCK_K)  # fmt: skip
        cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        col_ok = cols < N
        acc = tl.sum(a.to(tl.float32) * w_cur.to(tl.float32), axis=1)  # [BN]
        if W_SCALE:
            acc *= tl.load(s_ptr + cols, mask=col_ok, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if SILU_MUL:
            up = tl.sum(a.to(tl.float32) * wu_cur.to(tl.float32), axis=1)
            if W_SCALE:
                up *= tl.load(s_ptr + up_offset + cols, mask=col_ok, other=0.0)
            if HAS_BIAS:
                up += tl.load(b_ptr + up_offset + cols, mask=col_ok, other=0.0).to(tl.float32)
            gate = acc.to(act_ty).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(act_ty).to(tl.float32)
            y = (silu * up.to(act_ty).to(tl.float32)).to(act_ty)
        else:
            y = acc.to(act_ty)
        tl.store(out_ptr + cols, y, mask=col_ok)


def l2_tiles(tiles: int, programs: int, tile_bytes: int, budget_bytes: int) -> int:
    """Tiles each program of a launch prefetches into L2 before its PDL wait: as many of
    its later tiles (it has ``ceil(tiles / programs)``, the first loaded into registers) as
    keep the launch's prefetch within ``budget_bytes``, at most MAX_L2_TILES.

    Args:
        tiles: output tiles of the launch; programs: its persistent grid.
        tile_bytes: weight bytes of one tile (both halves with SiLU-and-mul).
        budget_bytes: the most bytes all programs prefetch together
            (``VLLM_TRITON_L2_PREFETCH_MB``); 0 turns the prefetch off.
    Returns:
        0 to MAX_L2_TILES.
    """
    if budget_bytes <= 0 or programs <= 0 or tile_bytes <= 0:
        return 0
    later = -(-tiles // programs) - 1
    return max(0, min(MAX_L2_TILES, later, budget_bytes // (programs * tile_bytes)))


def launch(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
    eps: float, weight: torch.Tensor, bias: torch.Tensor | None, silu_mul: bool,
    out: torch.Tensor, res_out: torch.Tensor, cfg: dict, weight_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Fill ``out`` [1, N_out] (and ``res_out`` [1, K] when ``residual`` is given) for one
    row ``x`` [1, K] (unit strides, checked by the caller :func:`gemv._launch`).

    ``cfg``: ``BLOCK_N`` outputs per tile, ``num_warps``, ``PERSIST`` programs per SM
    (the grid is ``min(tiles, PERSIST * SMs)``; on CPU, under the interpreter, 2 "SMs").
    ``weight_scale``: [N] float32 row scales of an fp8 ``weight``, or None.
    With PDL, each program prefetches :func:`l2_tiles` later tiles into L2 before its wait
    (budget ``VLLM_TRITON_L2_PREFETCH_MB`` MiB a launch; none without PDL).
    """
    n = out.shape[1]
    k = x.shape[1]
    tiles = triton.cdiv(n, cfg["BLOCK_N"])
    sms = cuda_sm_count(x.device.index or 0) if x.is_cuda else 2
    programs = min(tiles, cfg["PERSIST"] * sms)
    pdl = pdl_enabled(x)
    tile_bytes = cfg["BLOCK_N"] * k * weight.element_size() * (2 if silu_mul else 1)
    budget = (envs.VLLM_TRITON_L2_PREFETCH_MB << 20) if pdl else 0
    if weight_scale is not None and not x.is_cuda:  # numpy, under the interpreter, has no fp8
        weight = weight.float()
    _rows_kernel[(programs,)](
        x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else weight, weight,
        weight_scale if weight_scale is not None else out,
        bias if bias is not None else weight, out, res_out,
        n, k, weight.stride(0), n, float(eps),
        NORM=norm_weight is not None, ADD_RES=residual is not None, SILU_MUL=silu_mul,
        HAS_BIAS=bias is not None, W_SCALE=weight_scale is not None, BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=triton.next_power_of_2(k), LINE=L2_LINE_BYTES // weight.element_size(),
        L2_TILES=l2_tiles(tiles, programs, tile_bytes, budget), PDL=pdl,
        num_warps=cfg["num_warps"],
        **launch_options(pdl),
    )  # fmt: skip
