"""A whole decoder layer for ONE decode token in one Triton launch (a persistent kernel).

Why: at batch 1 a small model's step is a chain of dependent kernels, not bytes. SmolLM2-135M
spends ~1.3 ms per token on ~190 kernels (seven per layer: the four projection GEMVs of
:mod:`triton_gemv`, FlashInfer's rotary, decode and merge), each a few microseconds of work
plus ~2 us of launch and drain inside a CUDA graph, while its weights take ~60 us to read at
the H200's bandwidth. Here one launch runs a layer's five dependent phases, separated by
grid-wide barriers instead of kernel boundaries:

A. ``[s1 = residual + h]`` -> RMSNorm -> ``@ W_qkv.T (+ bias)`` into a qkv scratch row;
B. attention: RoPE on q/k, the cache write of the new key/value and split-KV attention over
   the context, program for program the ``(row 0, kv head, split)`` programs of
   :func:`vllm.attention.triton_decode.decode_program` (same arithmetic, same splits);
C. ``o = attn @ W_o.T``;
D. ``s2 = s1 + o`` -> RMSNorm -> ``@ W_gate_up.T`` -> ``silu(gate) * up``;
E. ``out = act @ W_down.T``; returns ``(out, s2)`` like ``LlamaDecoderLayer.forward``.

Phases A, C, D and E are :func:`triton_gemv._gemv_tile` over output tiles (the 1-row
configuration of ``triton_gemv.launch_config``), so each program's arithmetic is that of
the separate kernels. A program loads the first weight tile of its next phase BEFORE the
barrier (weights are never written during a step), so the barrier's wait overlaps those
loads, the way ``pdl_wait`` does between kernels.

Barrier (:func:`_grid_sync`): a CTA-wide ``debug_barrier``, one release ``atomic_add`` on the
phase's counter, a spin on volatile loads until all ``nprog`` programs arrived, one acquire
atomic, another CTA barrier (the pattern of CUDA cooperative groups' grid sync). It needs
every program resident at once, so the grid is at most one program per SM
(:func:`grid_size`); the counters (``DecodeWorkspace.layer_sync``) are reset by the last
program to leave, so each launch finds them at zero. Data written by another program of the
launch is read with the ``.cg`` cache modifier (L2, never a stale L1 line). Under
``TRITON_INTERPRET=1`` (CPU tests) programs run one after another, so the grid is one
program, which then loops over every tile.

Used by the decoder (``LlamaDecoderLayer.forward_small_batch``) when
``VLLM_FUSED_DECODER_LAYER=1`` (read at each call), the step's attention metadata offers
:class:`~vllm.attention.backends.abstract.PagedDecodeTables` (FLASHINFER's small-decode
path), the row count is 1, the projections run on :mod:`triton_gemv`, and o_proj and the
MLP have no bias.

Off by default, because it measured SLOWER (H200, bf16, SmolLM2 shape, context 192, 30
layers in a CUDA graph, benchmarks/kernel_decoder_layer.py): 41.0 us per layer against
30.9 us for the same layer as separate PDL-chained kernels, and 699 against 798 tok/s at
batch 1 in the engine. The phase stamps show why: the attention phase's slowest program
takes 12 us (its chain of dependent loads: lengths, q/k, cos/sin, block table, keys, values,
then the split merge), and every other program waits for it at the barrier; gate_up's 192
tiles over 132 programs take two rounds (8.8 us); and each barrier adds ~2-2.5 us beyond
its slowest arrival, about what a kernel boundary costs with PDL. A barrier is not cheaper
than a PDL kernel boundary here, so fusing only pays once the phases' own critical paths
shrink (the attention's loads of cached keys and values do not depend on phase A and could
be issued before the first barrier).

This module imports ``triton`` at the top: reach it through
:func:`vllm.model_executor.layers.triton_dispatch.get_triton_layer`.
"""

import os

import torch
import triton
import triton.language as tl

from vllm.attention.triton_decode import LOG2E, MAX_SPLITS, decode_program, decode_tiles
from vllm.model_executor.layers.triton_gemv import _gemv_tile, _w_tile, launch_config
from vllm.model_executor.layers.triton_pdl import launch_options, pdl_enabled, pdl_wait
from vllm.utils import cuda_sm_count

SYNC_STRIDE = 64  # ints between two barriers' counters (a counter and its flag per 256 B)
NUM_SYNC_INTS = 5 * SYNC_STRIDE  # four barriers, then the exit count
SYNC: tl.constexpr = tl.constexpr(SYNC_STRIDE)
FLAG: tl.constexpr = tl.constexpr(32)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read once, as triton does


def grid_size(layer, x: torch.Tensor, block_n: int) -> int:
    """Programs of a launch of ``layer`` (a ``LlamaDecoderLayer``) on ``x``'s device with
    ``block_n`` output features per tile: one per SM (every program must be resident for
    the barriers), at most the largest phase's work items (projection tiles, attention
    (kv head, split) pairs); 1 under the interpreter."""
    if _INTERPRETED or not x.is_cuda:
        return 1
    attn = layer.self_attn
    outputs = (attn.qkv_proj.weight.shape[0], layer.mlp.down_proj.weight.shape[1], x.shape[1])
    work = max(max(triton.cdiv(n, block_n) for n in outputs), attn.num_kv_heads * MAX_SPLITS)
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return max(1, min(cuda_sm_count(index), work))


@triton.jit
def _grid_sync(sync_ptr, nprog):
    """Wait until all ``nprog`` programs reached this barrier; every store before it, by any
    program, is visible after it. ``sync_ptr``: the barrier's arrival counter; its release
    flag is ``FLAG`` ints further (another 128-byte line, so the spinning loads and the
    arrivals do not queue on one line). The last program to arrive raises the flag; the
    others spin on it with one acquire load per program (Triton issues a scalar atomic from
    one thread and broadcasts it), not one per thread."""
    tl.debug_barrier()  # this program's threads have all stored
    arrived = tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == nprog - 1:
        tl.atomic_xchg(sync_ptr + FLAG, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(sync_ptr + FLAG, 0, sem="acquire", scope="gpu")
    while seen == 0:
        seen = tl.atomic_add(sync_ptr + FLAG, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _stamp(t_ptr, pid, i: tl.constexpr, TIMING: tl.constexpr):
    """With TIMING, store the GPU's global nanosecond timer at ``t_ptr[pid, i]`` (phase
    timings for benchmarks/kernel_decoder_layer.py); nothing otherwise."""
    if TIMING:
        now = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1
        )
        tl.store(t_ptr + pid * 16 + i, now)


@triton.jit
def _projection(pid, nprog, w, wu, x_ptr, w_ptr, out_ptr, N, K, IEEE: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """``out = x @ W.T`` (one row, no norm or bias; x written by this launch) over output
    tiles pid, pid + nprog, ...; ``w, wu``: the program's first weight tile, prefetched."""
    for tile in range(pid, tl.cdiv(N, BLOCK_N), nprog):
        _gemv_tile(
            tile, w, wu, x_ptr, x_ptr, w_ptr, w_ptr, w_ptr, out_ptr, out_ptr,
            1, N, K, 0, 0, K, 0, 0, 0, 0.0,
            False, False, False, False, False, IEEE, 1, BLOCK_N, BLOCK_K, ".cg",
        )  # fmt: skip
        w, wu = _w_tile(w_ptr, tile + nprog, N, K, K, 0, False, BLOCK_N, BLOCK_K)


@triton.jit
def _decoder_layer_kernel(
    h_ptr, res_ptr, ln1_ptr, wqkv_ptr, bqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wd_ptr,
    pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, part_ptr, cnt_ptr, sync_ptr,
    qkv_ptr, attn_ptr, o_ptr, s1_ptr, act_ptr, out_ptr, res_out_ptr, t_ptr,
    hidden, q_size, kv_size, inter, eps1, eps2, qk_scale, cs_stride, bt_stride,
    block_stride, value_offset, token_stride, scratch_block, num_kv_heads, nprog,
    ADD_RES: tl.constexpr, QKV_BIAS: tl.constexpr, ROTATE: tl.constexpr, IEEE: tl.constexpr,
    GROUP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, SHORT_T: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_K_O: tl.constexpr, BLOCK_K_DOWN: tl.constexpr,
    PDL: tl.constexpr, TIMING: tl.constexpr,
):  # fmt: skip
    """Phases A-E of the module docstring; program ``pid`` takes tiles pid, pid + nprog, ...
    Tiles as the separate kernels take them: ``BLOCK_K`` of K for qkv and gate_up,
    ``BLOCK_K_O`` for o_proj, ``BLOCK_K_DOWN`` for down_proj; attention tiles
    ``BLOCK_T`` / ``SHORT_T`` as :func:`decode_program` picks them."""
    pid = tl.program_id(0)
    nqkv = q_size + 2 * kv_size
    # A: norm + qkv (the first weight tile before waiting for the previous kernel)
    w, wu = _w_tile(wqkv_ptr, pid, nqkv, hidden, hidden, 0, False, BLOCK_N, BLOCK_K)
    pdl_wait(PDL)
    _stamp(t_ptr, pid, 0, TIMING)
    for tile in range(pid, tl.cdiv(nqkv, BLOCK_N), nprog):
        _gemv_tile(
            tile, w, wu, h_ptr, res_ptr, ln1_ptr, wqkv_ptr, bqkv_ptr, qkv_ptr, s1_ptr,
            1, nqkv, hidden, 0, 0, hidden, 0, 0, 0, eps1,
            True, ADD_RES, False, QKV_BIAS, False, IEEE, 1, BLOCK_N, BLOCK_K, "",
        )  # fmt: skip
        w, wu = _w_tile(wqkv_ptr, tile + nprog, nqkv, hidden, hidden, 0, False, BLOCK_N, BLOCK_K)
    w, wu = _w_tile(wo_ptr, pid, hidden, q_size, q_size, 0, False, BLOCK_N, BLOCK_K_O)  # C
    _stamp(t_ptr, pid, 1, TIMING)
    _grid_sync(sync_ptr, nprog)
    _stamp(t_ptr, pid, 2, TIMING)
    # B: attention, (kv head, split) pairs; splits past the row's count do nothing
    zero = pid * 0  # row 0, as a tensor
    for pair in range(pid, num_kv_heads * SPLITS, nprog):
        decode_program(
            zero, pair % num_kv_heads, pair // num_kv_heads,
            qkv_ptr, qkv_ptr + q_size, qkv_ptr + q_size + kv_size, pos_ptr, cs_ptr,
            cache_ptr, bt_ptr, len_ptr, attn_ptr, part_ptr, cnt_ptr,
            0, 0, 0, cs_stride, bt_stride, 0, block_stride, value_offset, token_stride,
            scratch_block, qk_scale, num_kv_heads,
            GROUP, GP, HALF, BS, BLOCK_T, SHORT_T, ROTATE, SPLITS, ".cg", False,
        )  # fmt: skip
    _stamp(t_ptr, pid, 3, TIMING)
    _grid_sync(sync_ptr + SYNC, nprog)
    _stamp(t_ptr, pid, 4, TIMING)
    # C: o_proj
    _projection(pid, nprog, w, wu, attn_ptr, wo_ptr, o_ptr, hidden, q_size, IEEE, BLOCK_N,
                BLOCK_K_O)  # fmt: skip
    w, wu = _w_tile(wgu_ptr, pid, inter, hidden, hidden, inter, True, BLOCK_N, BLOCK_K)  # D
    _stamp(t_ptr, pid, 5, TIMING)
    _grid_sync(sync_ptr + 2 * SYNC, nprog)
    _stamp(t_ptr, pid, 6, TIMING)
    # D: s2 = s1 + o, norm, gate_up, SiLU-and-mul
    for tile in range(pid, tl.cdiv(inter, BLOCK_N), nprog):
        _gemv_tile(
            tile, w, wu, o_ptr, s1_ptr, ln2_ptr, wgu_ptr, wgu_ptr, act_ptr, res_out_ptr,
            1, inter, hidden, 0, 0, hidden, 0, 0, inter, eps2,
            True, True, True, False, False, IEEE, 1, BLOCK_N, BLOCK_K, ".cg",
        )  # fmt: skip
        w, wu = _w_tile(wgu_ptr, tile + nprog, inter, hidden, hidden, inter, True, BLOCK_N,
                        BLOCK_K)  # fmt: skip
    w, wu = _w_tile(wd_ptr, pid, hidden, inter, inter, 0, False, BLOCK_N, BLOCK_K_DOWN)  # E
    _stamp(t_ptr, pid, 7, TIMING)
    _grid_sync(sync_ptr + 3 * SYNC, nprog)
    _stamp(t_ptr, pid, 8, TIMING)
    # E: down_proj
    _projection(pid, nprog, w, wu, act_ptr, wd_ptr, out_ptr, hidden, inter, IEEE, BLOCK_N,
                BLOCK_K_DOWN)  # fmt: skip
    _stamp(t_ptr, pid, 9, TIMING)
    # the last program out resets the counters for the next launch (all passed every spin)
    left = tl.atomic_add(sync_ptr + 4 * SYNC, 1, sem="acq_rel", scope="gpu")
    if left == nprog - 1:
        for i in tl.static_range(4):
            tl.atomic_xchg(sync_ptr + i * SYNC, 0)
            tl.atomic_xchg(sync_ptr + i * SYNC + FLAG, 0)
        tl.atomic_xchg(sync_ptr + 4 * SYNC, 0)


def decoder_layer(
    layer, positions: torch.Tensor, hidden_states: torch.Tensor,
    residual: torch.Tensor | None, kv_cache: torch.Tensor, tables,
    nprog: int | None = None, block_n: int | None = None, timings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``layer.forward`` for one decode token in one launch (module docstring).

    Args:
        layer: a ``LlamaDecoderLayer`` (reads its norms' ``weight`` / ``variance_epsilon``,
            ``self_attn.qkv_proj`` / ``o_proj`` / ``rotary_emb`` / ``attn``, and
            ``mlp.gate_up_proj`` / ``down_proj``); o_proj and the MLP without bias.
        positions: [1] int64, the token's position.
        hidden_states: [1, hidden]; residual: [1, hidden] or None (the first layer).
        kv_cache: [num_blocks + 1, 2, block_size, num_kv_heads, head_size] (FLASHINFER NHD).
        tables: :class:`~vllm.attention.backends.abstract.PagedDecodeTables` of the step
            (its workspace holds the barrier counters and the attention partials).
        nprog, block_n: programs and output features per tile, default :func:`grid_size`
            and ``launch_config``'s (benchmarks/kernel_decoder_layer.py sweeps them).
        timings: [nprog, 16] int64 to receive each program's phase timestamps (ns), or None.

    Returns:
        (mlp output [1, hidden], the residual before it [1, hidden]), in the activation dtype.

    Raises:
        ValueError: more than one row, a biased o_proj / MLP, or shapes that disagree.
    """
    attn, mlp = layer.self_attn, layer.mlp
    ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
    if hidden_states.dim() != 2 or hidden_states.shape[0] != 1:
        raise ValueError(f"one row expected, got hidden_states {tuple(hidden_states.shape)}")
    if (
        attn.o_proj.bias is not None
        or mlp.gate_up_proj.bias is not None
        or (mlp.down_proj.bias is not None)
    ):
        raise ValueError("the fused decoder layer supports a qkv bias only")
    hidden = hidden_states.shape[1]
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    heads = attn.attn.num_heads
    if num_kv_heads != attn.attn.num_kv_heads or head_size != attn.head_dim:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} does not match the layer's heads")
    q_size, kv_size = attn.q_size, attn.kv_size
    inter = mlp.down_proj.weight.shape[1]
    act_dtype = hidden_states.dtype
    scratch = torch.empty(q_size + 2 * kv_size + q_size + 3 * hidden + inter, dtype=act_dtype,
                          device=hidden_states.device)  # fmt: skip
    qkv, att, o, s1, out, act = scratch.split(
        [q_size + 2 * kv_size, q_size, hidden, hidden, hidden, inter]
    )
    res_out = torch.empty_like(hidden_states)  # [1, hidden]
    x = hidden_states if hidden_states.stride(1) == 1 else hidden_states.contiguous()
    if residual is None:
        s1 = x  # the layer's input is its residual
    elif residual.stride(1) != 1:
        residual = residual.contiguous()
    cfg = dict(launch_config(1, inter, hidden))
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    group = heads // num_kv_heads
    tile, short = decode_tiles(group, head_size)
    ws = tables.workspace
    rotate = attn.rotary_emb is not None
    cs = attn.rotary_emb.cos_sin_cache if rotate else kv_cache
    st = kv_cache.stride()
    w_qkv = attn.qkv_proj.weight
    nprog = nprog or grid_size(layer, x, cfg["BLOCK_N"])
    if ws.layer_sync.numel() < NUM_SYNC_INTS:
        raise ValueError(f"workspace.layer_sync holds {ws.layer_sync.numel()} < {NUM_SYNC_INTS}")
    if timings is not None and tuple(timings.shape) != (nprog, 16):
        raise ValueError(f"timings must be [{nprog}, 16], got {tuple(timings.shape)}")
    pdl = pdl_enabled(x)
    _decoder_layer_kernel[(nprog,)](
        x, residual if residual is not None else x, ln1.weight, w_qkv,
        attn.qkv_proj.bias if attn.qkv_proj.bias is not None else w_qkv,
        attn.o_proj.weight, ln2.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight,
        positions, cs, kv_cache, tables.block_tables, tables.seq_lens, ws.partials,
        ws.counters, ws.layer_sync, qkv, att, o, s1, act, out, res_out,
        timings if timings is not None else ws.layer_sync,
        hidden, q_size, kv_size, inter, float(ln1.variance_epsilon),
        float(ln2.variance_epsilon), attn.attn.scale * LOG2E, cs.stride(0) if rotate else 0,
        tables.block_tables.stride(0), st[0], st[1], st[2], tables.scratch_block,
        num_kv_heads, nprog,
        ADD_RES=residual is not None, QKV_BIAS=attn.qkv_proj.bias is not None, ROTATE=rotate,
        IEEE=w_qkv.dtype == torch.float32, GROUP=group, GP=triton.next_power_of_2(group),
        HALF=head_size // 2, BS=block_size, BLOCK_T=tile, SHORT_T=short,
        SPLITS=MAX_SPLITS, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        BLOCK_K_O=launch_config(1, hidden, q_size)["BLOCK_K"],
        BLOCK_K_DOWN=launch_config(1, hidden, inter)["BLOCK_K"], PDL=pdl,
        TIMING=timings is not None,
        num_warps=cfg["num_warps"], enable_fp_fusion=False, **launch_options(pdl),
    )  # fmt: skip
    return out.view(1, hidden), res_out
