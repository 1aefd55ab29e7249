"""Small-batch paged decode attention in ONE Triton launch per layer: RoPE on the new
query and key, the cache write of the new key and value, and attention over the context.

Why: at one to a few decode rows a layer's attention is a chain of tiny launches
(FlashInfer: a rotary + cache-write kernel, the split-KV decode kernel and its merge, after
a host-side ``plan`` every step). This kernel does all of it in one launch and reads its
lengths and block tables from device buffers, so a captured graph can advance itself by a
token without the host (the decode-loop graphs).

Layout: program ``(b, h, s)`` handles row ``b``, KV head ``h`` (its ``G = H / H_kv``
query heads together, GQA) and context split ``s``. A row of context length ``L`` (the new
token included) is cut into splits of ``chunk(L) = max(T, ceil(L / C))`` tokens, rounded
up to the tile ``T`` (16 tokens for rows of at most ``16 C``, else :func:`tile_tokens`, a
function of the model's head shapes), where ``C`` is the launch's split cap
(:func:`split_cap`): MAX_SPLITS up to 32 (row, KV head) pairs, rows counted as their next
power of two (every one-row step of a model with at most 32 KV heads), fewer as the batch
grows.
So at a few rows a short context is a few one-tile splits that run side by side instead of
a loop in one program (a small step's attention is bound by dependent memory round trips,
not bytes), and at large batches the pairs fill the GPU with few, long splits. The split
count depends on the row's own length and the cap only, so a row's result does not depend
on the other rows' lengths, the grid size or whether a graph runs it (and, within the cap
of MAX_SPLITS, not on the batch at all). Programs past a row's split
count exit at once. With one split the program writes the output; otherwise each split
stores its partial ``(max, sum, acc)`` and the last split to finish (an atomic counter per
row and head) merges all of them in one vectorised pass (a fixed reduction, so the result
is deterministic) and resets the counter for the next launch.

The new token is never read back from the cache: the last split takes its rotated key and
value from registers (rounded to the cache dtype, as the cache holds them) and writes them
to the cache slot ``block_tables[b, p // block_size] * block_size + p % block_size`` at
``p = positions[b]``. A padded lane (length 0) writes the scratch block's first slot and
attends to its own token only.

With PDL (:mod:`pdl`) a program first reads what no kernel of the step writes (its
row's length and position, the RoPE cos / sin, its split's first tile of cached keys and
values: :func:`decode_prefetch`), then waits for the qkv projection and reads the new
query, key and value: the cache reads overlap the projection. H200, one row, context 192:
8.5 -> 7.5 us a layer for SmolLM2's shape, 10.8 -> 10.6 for Llama-3.1-8B's
(benchmarks/kernel_decode_attention.py, without the prefetch -> with it).

Arithmetic: scores and softmax in float32 (base-2 exponentials with the scale folded into
``log2(e) * scale``, as FlashAttention-style kernels do), probabilities times values in
float32, the output rounded once to the query dtype. RoPE rounds like
``RotaryEmbedding.forward_native`` (:func:`norm_rotary.rope_halves`).

This module imports ``triton`` at the top: reach it through
:func:`vllm.kernels.dispatch.decode_attention` (FLASHINFER's small-decode path, CUDA
only; CPU tests run it under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm.kernels.norm_rotary import rope_halves
from vllm.kernels.pdl import launch_options, pdl_enabled, pdl_wait

MAX_SPLITS = 32  # the most splits of one row (and the grid's third dimension at most)
# Rows of at most cap * SHORT_TILE tokens (cap: the launch's split_cap, so 512 tokens at a
# few rows) take 16-token tiles whatever tile_tokens gives (a runtime branch of the one
# kernel). The small path's layer chain
# (30 SmolLM2 layers in one graph, H200, bf16, as separate kernels) at context 192:
# 16.57 us a layer with 32-token tiles, 15.62 with 16; at 1024, 16-token tiles lost
# (17.97 -> 20.2: two tiles a split), so longer rows keep tile_tokens'. Decode attention
# alone (benchmarks/kernel_decode_attention.py) agreed for the Llama-3.1-8B shape: 10.62
# -> 9.11 us at 192, 13.34 -> 17.51 at 1024.
SHORT_TILE = 16
LOG2E = 1.4426950408889634


def tile_tokens(group: int, head_size: int) -> int:
    """Context tokens per tile (and per split of a short row) for a GQA group of ``group``
    query heads of size ``head_size``: the [group_pad, T, D / 2] products stay near 8K
    floats (64 registers a thread at 4 warps), 16 <= T <= 32. The cap of 32:
    benchmarks/kernel_decode_attention.py on an H200 (bf16, one row) timed SmolLM2's
    shape at 8.5 / 9.1 us per layer with T = 32 against 10.3 / 10.5 with T = 64
    (contexts 192 / 1024); the Llama-3.1-8B shape's 32 was already the best at
    1024 tokens (14.1 us; 16 tokens: 18.4)."""
    group_pad = triton.next_power_of_2(group)
    return max(16, min(32, triton.next_power_of_2(max(1, 8192 // (group_pad * head_size // 2)))))


def decode_tiles(group: int, head_size: int, tile: int | None = None) -> tuple[int, int]:
    """``(BLOCK_T, SHORT_T)`` of :func:`decode_program`: tokens per tile of a long row and
    of a row of at most ``cap * SHORT_T`` tokens (``cap``: the launch's :func:`split_cap`).
    Default ``(tile_tokens(...),
    min(SHORT_TILE, tile_tokens(...)))``; a given ``tile`` serves every row."""
    if tile:
        return tile, tile
    long = tile_tokens(group, head_size)
    return long, min(SHORT_TILE, long)


def num_splits(max_seq_len: int, tile: int) -> int:
    """Grid programs per (row, KV head) that cover contexts up to ``max_seq_len`` tokens."""
    return max(1, min(MAX_SPLITS, -(-max_seq_len // tile)))


# A launch caps each row's splits so that (rows x KV heads x splits) stays near this many
# programs: at one to a few rows every row takes up to MAX_SPLITS splits (a short step is
# bound by dependent round trips), at large batches the (row, head) pairs already fill the
# GPU and fewer, longer splits save the partials' writes and the merge. H200, bf16,
# benchmarks/kernel_decode_attention.py --splits, microseconds a layer at contexts 256 /
# 1024 with 32 splits against this cap: Qwen2.5-0.5B's shape at 64 rows 78.2 / 184.3 ->
# 51.5 / 164.9 (cap 8), at 256 rows 282.0 / 682.5 -> 169.2 / 612.5 (cap 2); SmolLM2's at
# 64 rows 43.1 / 98.6 -> 28.6 / 93.0 (cap 5, timed at 4).
SPLIT_PROGRAMS = 1024


def split_cap(rows: int, num_kv_heads: int) -> int:
    """The most splits of one row in a launch of ``rows`` rows:
    ``SPLIT_PROGRAMS // (next_power_of_2(rows) * num_kv_heads)`` clamped to [1, MAX_SPLITS]
    (MAX_SPLITS while that product is at most 32). A function of the row count's power of
    two, so with the default capture sizes (every power of two from 8 up is one) a graph
    padded to a captured size and the eager step of the same rows take the same cap."""
    pairs = triton.next_power_of_2(max(1, rows)) * max(1, num_kv_heads)
    return max(1, min(MAX_SPLITS, SPLIT_PROGRAMS // pairs))


class DecodeWorkspace:
    """Scratch of multi-split rows, shared by every layer, graph and virtual engine of one
    worker (they run one launch at a time on one stream).

    Args:
        max_rows: the most rows of a launch.
        max_splits: the most splits of a row in every launch (e.g. MAX_SPLITS to time any
            cap); default None: :func:`split_cap` of the launch's rows.

    Attributes:
        records: how many (row, KV head, split) partials ``partials`` holds: the most
            (row, KV head, split) triples a launch of at most ``max_rows`` rows uses (rows x
            kv_heads x :func:`split_cap`, or x ``max_splits``).
        partials: [records * group_pad * (2 + head_size)] float32, per split its running
            max, sum and unnormalised output.
        counters: [max_rows * kv_heads] int32 arrivals per (row, head); every launch leaves
            them at zero.
    """

    def __init__(self, max_rows: int, num_heads: int, num_kv_heads: int, head_size: int,
                 device: torch.device, max_splits: int | None = None):  # fmt: skip
        self.max_rows = max_rows
        group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
        self.records = max(
            r * num_kv_heads * (max_splits or split_cap(r, num_kv_heads))
            for r in range(1, max(1, max_rows) + 1)
        )
        n = self.records * group_pad * (2 + head_size)
        self.partials = torch.empty(n, dtype=torch.float32, device=device)
        self.counters = torch.zeros(max_rows * num_kv_heads, dtype=torch.int32, device=device)


@triton.jit
def _split_bounds(seq_len, s, cap, BLOCK_T: tl.constexpr):
    """Split ``s`` of a row of ``seq_len`` tokens (the new one included; 0 on a padded
    lane, treated as 1) cut into at most ``cap`` splits: ``(n_split, start, end)``, the
    row's split count and the split's cached tokens ``[start, end)`` (the new token,
    position ``seq_len - 1``, is in none)."""
    n_ctx = tl.maximum(seq_len, 1)
    chunk = tl.cdiv(tl.cdiv(n_ctx, cap), BLOCK_T) * BLOCK_T  # >= BLOCK_T
    start = s * chunk
    return tl.cdiv(n_ctx, chunk), start, tl.minimum(start + chunk, n_ctx - 1)


@triton.jit
def _tile_kv(bt_row, t, t_mask, cache_ptr, block_stride, value_offset, token_stride, head_off,
             offs_d, HALF: tl.constexpr, BS: tl.constexpr):  # fmt: skip
    """The cached keys and values of context tokens ``t`` [BLOCK_T] (masked by ``t_mask``)
    through the row's block table ``bt_row``: k1, k2, v1, v2 [BLOCK_T, HALF] in the cache
    dtype (first and second halves of each head)."""
    blk = tl.load(bt_row + t // BS, mask=t_mask, other=0)
    base = blk.to(tl.int64) * block_stride + (t % BS) * token_stride + head_off  # [BLOCK_T]
    k_ptrs = cache_ptr + base[:, None] + offs_d[None, :]  # [BLOCK_T, HALF]
    m2 = t_mask[:, None]
    k1 = tl.load(k_ptrs, mask=m2, other=0.0)
    k2 = tl.load(k_ptrs + HALF, mask=m2, other=0.0)
    v1 = tl.load(k_ptrs + value_offset, mask=m2, other=0.0)
    v2 = tl.load(k_ptrs + value_offset + HALF, mask=m2, other=0.0)
    return k1, k2, v1, v2


@triton.jit
def _tile_attend(q1, q2, k1, k2, v1, v2, t_mask, m_i, l_i, acc1, acc2):
    """One tile's online-softmax update: scores of the scaled queries q1, q2 [GP, HALF]
    against k1, k2 [BLOCK_T, HALF], then the running max m_i [GP], sum l_i [GP] and
    unnormalised outputs acc1, acc2 [GP, HALF] (all float32) rescaled and advanced."""
    k1, k2 = k1.to(tl.float32), k2.to(tl.float32)
    sc = tl.sum(q1[:, None, :] * k1[None, :, :], axis=2)  # [GP, BLOCK_T]
    sc += tl.sum(q2[:, None, :] * k2[None, :, :], axis=2)
    sc = tl.where(t_mask[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp2(m_i - m_new)  # [GP]
    p = tl.exp2(sc - m_new[:, None])  # [GP, BLOCK_T]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * v1.to(tl.float32)[None, :, :], axis=1)
    acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * v2.to(tl.float32)[None, :, :], axis=1)
    return m_new, l_i, acc1, acc2


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, out_ptr,
    part_ptr, cnt_ptr,
    q_stride, k_stride, v_stride, cs_stride, bt_stride, out_stride,
    block_stride, value_offset, token_stride, scratch_block, qk_scale, num_kv_heads, cap,
    GROUP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, SHORT_T: tl.constexpr, ROTATE: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """See the module docstring. ``qk_scale`` = softmax scale * log2(e); ``cap``: the
    launch's most splits a row (:func:`split_cap`, at most ``SPLITS``)."""
    decode_program(
        tl.program_id(0), tl.program_id(1), tl.program_id(2),
        q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, out_ptr,
        part_ptr, cnt_ptr, q_stride, k_stride, v_stride, cs_stride, bt_stride, out_stride,
        block_stride, value_offset, token_stride, scratch_block, qk_scale, num_kv_heads, cap,
        GROUP, GP, HALF, BS, BLOCK_T, SHORT_T, ROTATE, SPLITS, PDL,
    )  # fmt: skip


@triton.jit
def decode_program(
    b, h, s, q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, out_ptr,
    part_ptr, cnt_ptr, q_stride, k_stride, v_stride, cs_stride, bt_stride, out_stride,
    block_stride, value_offset, token_stride, scratch_block, qk_scale, num_kv_heads, cap,
    GROUP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, SHORT_T: tl.constexpr, ROTATE: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The work of program ``(b, h, s)`` (module docstring); nothing when ``s`` is past row
    ``b``'s split count. A row of at most ``cap * SHORT_T`` tokens takes tiles of
    ``SHORT_T`` tokens, a longer one of ``BLOCK_T`` (the row's own length and the launch's
    split cap decide; :func:`decode_tiles` gives the pair). ``PDL``: wait for the kernel
    before between :func:`decode_prefetch` and :func:`decode_attend`."""
    if tl.load(len_ptr + b) <= cap * SHORT_T:
        _decode_tiles(
            b, h, s, q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr,
            out_ptr, part_ptr, cnt_ptr, q_stride, k_stride, v_stride, cs_stride, bt_stride,
            out_stride, block_stride, value_offset, token_stride, scratch_block, qk_scale,
            num_kv_heads, cap, GROUP, GP, HALF, BS, SHORT_T, ROTATE, SPLITS, PDL,
        )  # fmt: skip
    else:
        _decode_tiles(
            b, h, s, q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr,
            out_ptr, part_ptr, cnt_ptr, q_stride, k_stride, v_stride, cs_stride, bt_stride,
            out_stride, block_stride, value_offset, token_stride, scratch_block, qk_scale,
            num_kv_heads, cap, GROUP, GP, HALF, BS, BLOCK_T, ROTATE, SPLITS, PDL,
        )  # fmt: skip


@triton.jit
def _decode_tiles(
    b, h, s, q_ptr, k_ptr, v_ptr, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, out_ptr,
    part_ptr, cnt_ptr, q_stride, k_stride, v_stride, cs_stride, bt_stride, out_stride,
    block_stride, value_offset, token_stride, scratch_block, qk_scale, num_kv_heads, cap,
    GROUP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, ROTATE: tl.constexpr, SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """:func:`decode_program` with tiles of ``BLOCK_T`` tokens: the reads no kernel of the
    step writes (:func:`decode_prefetch`), the PDL wait, then the rest."""
    pre = decode_prefetch(
        b, h, s, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, cs_stride, bt_stride,
        block_stride, value_offset, token_stride, cap, HALF, BS, BLOCK_T, ROTATE,
    )  # fmt: skip
    pdl_wait(PDL)  # q, k, v come from the kernel before
    decode_attend(
        b, h, s, pre, q_ptr, k_ptr, v_ptr, cache_ptr, bt_ptr, out_ptr, part_ptr, cnt_ptr,
        q_stride, k_stride, v_stride, bt_stride, out_stride, block_stride, value_offset,
        token_stride, scratch_block, qk_scale, num_kv_heads, cap,
        GROUP, GP, HALF, BS, BLOCK_T, ROTATE, SPLITS,
    )  # fmt: skip


@triton.jit
def decode_prefetch(
    b, h, s, pos_ptr, cs_ptr, cache_ptr, bt_ptr, len_ptr, cs_stride, bt_stride,
    block_stride, value_offset, token_stride, cap,
    HALF: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr, ROTATE: tl.constexpr,
):  # fmt: skip
    """Program ``(b, h, s)``'s reads that no kernel of the step writes, so that with PDL
    they may run before ``pdl_wait``: the row's length and position, the RoPE cos / sin of
    that position, and its split's first tile of cached keys and values (older tokens
    only: the new token's slot is written by this launch and never read back).

    Returns ``(seq_len, pos, cos, sin, k1, k2, v1, v2)``: scalars int32 / int64, cos and
    sin [HALF] float32 (rounded to the cache dtype first, as HF rounds them; ones and zeros
    without ROTATE), the tile [BLOCK_T, HALF] x 4 in the cache dtype (zeros past the
    split's cached tokens)."""
    seq_len = tl.load(len_ptr + b)
    _, start, end = _split_bounds(seq_len, s, cap, BLOCK_T)
    offs_d = tl.arange(0, HALF)  # [HALF]
    t = start + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    bt_row = bt_ptr + b.to(tl.int64) * bt_stride
    k1, k2, v1, v2 = _tile_kv(bt_row, t, t < end, cache_ptr, block_stride, value_offset,
                              token_stride, h * 2 * HALF, offs_d, HALF, BS)  # fmt: skip
    pos = tl.load(pos_ptr + b).to(tl.int64)
    dt = cache_ptr.dtype.element_ty
    if ROTATE:
        cs = cs_ptr + pos * cs_stride + offs_d
        cos = tl.load(cs).to(dt).to(tl.float32)  # HF rounds cos/sin to the dtype first
        sin = tl.load(cs + HALF).to(dt).to(tl.float32)
    else:
        cos = tl.full([HALF], 1.0, dtype=tl.float32)
        sin = tl.zeros([HALF], dtype=tl.float32)
    return seq_len, pos, cos, sin, k1, k2, v1, v2


@triton.jit
def decode_attend(
    b, h, s, pre, q_ptr, k_ptr, v_ptr, cache_ptr, bt_ptr, out_ptr, part_ptr, cnt_ptr,
    q_stride, k_stride, v_stride, bt_stride, out_stride, block_stride, value_offset,
    token_stride, scratch_block, qk_scale, num_kv_heads, cap,
    GROUP: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, ROTATE: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    """The rest of program ``(b, h, s)`` after :func:`decode_prefetch` (whose result is
    ``pre``): rotate the new query and key, attend over the split's tiles (the first one
    prefetched), write the new key and value (last split) and the output or the split's
    partial, and merge the partials (last split to arrive)."""
    seq_len, pos, cos, sin, k1t, k2t, v1t, v2t = pre
    dt = q_ptr.dtype.element_ty
    HEAD: tl.constexpr = 2 * HALF
    n_split, start, end = _split_bounds(seq_len, s, cap, BLOCK_T)
    if s < n_split:
        offs_g = tl.arange(0, GP)  # [GP]
        offs_d = tl.arange(0, HALF)  # [HALF]
        g_mask = offs_g < GROUP
        q_cols = (h * GROUP + offs_g)[:, None] * HEAD + offs_d[None, :]  # [GP, HALF]
        q_row = q_ptr + b.to(tl.int64) * q_stride + q_cols
        q1 = tl.load(q_row, mask=g_mask[:, None], other=0.0)
        q2 = tl.load(q_row + HALF, mask=g_mask[:, None], other=0.0)
        q1, q2 = q1.to(tl.float32), q2.to(tl.float32)
        k_row = k_ptr + b.to(tl.int64) * k_stride + h * HEAD + offs_d  # [HALF]
        k1 = tl.load(k_row).to(tl.float32)
        k2 = tl.load(k_row + HALF).to(tl.float32)
        if ROTATE:
            q1r, q2r = rope_halves(q1, q2, cos[None, :], sin[None, :], dt)
            k1n, k2n = rope_halves(k1, k2, cos, sin, dt)
        else:
            q1r, q2r, k1n, k2n = q1.to(dt), q2.to(dt), k1.to(dt), k2.to(dt)
        q1 = q1r.to(tl.float32) * qk_scale
        q2 = q2r.to(tl.float32) * qk_scale
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc1 = tl.zeros([GP, HALF], dtype=tl.float32)
        acc2 = tl.zeros([GP, HALF], dtype=tl.float32)
        head_off = h * HEAD
        t = start + tl.arange(0, BLOCK_T)  # [BLOCK_T]
        if start < end:  # the prefetched first tile
            m_i, l_i, acc1, acc2 = _tile_attend(
                q1, q2, k1t, k2t, v1t, v2t, t < end, m_i, l_i, acc1, acc2
            )
        bt_row = bt_ptr + b.to(tl.int64) * bt_stride
        for t0 in range(start + BLOCK_T, end, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
            t_mask = t < end
            k1c, k2c, v1c, v2c = _tile_kv(bt_row, t, t_mask, cache_ptr, block_stride,
                                          value_offset, token_stride, head_off, offs_d,
                                          HALF, BS)  # fmt: skip
            m_i, l_i, acc1, acc2 = _tile_attend(
                q1, q2, k1c, k2c, v1c, v2c, t_mask, m_i, l_i, acc1, acc2
            )
        if s == n_split - 1:  # the new token: from registers, and into the cache
            v_row = v_ptr + b.to(tl.int64) * v_stride + h * HEAD + offs_d
            v1n = tl.load(v_row)
            v2n = tl.load(v_row + HALF)
            blk_new = pos * 0 + scratch_block  # an int arg of 1 arrives as a constexpr
            off_new = pos * 0
            if seq_len > 0:
                blk_new = tl.load(bt_ptr + b.to(tl.int64) * bt_stride + pos // BS).to(tl.int64)
                off_new = pos % BS
            slot = cache_ptr + blk_new * block_stride + off_new * token_stride + head_off
            tl.store(slot + offs_d, k1n)
            tl.store(slot + HALF + offs_d, k2n)
            tl.store(slot + value_offset + offs_d, v1n)
            tl.store(slot + value_offset + HALF + offs_d, v2n)
            sc_new = tl.sum(q1 * k1n.to(tl.float32)[None, :], axis=1)  # [GP]
            sc_new += tl.sum(q2 * k2n.to(tl.float32)[None, :], axis=1)
            m_new = tl.maximum(m_i, sc_new)
            alpha = tl.exp2(m_i - m_new)
            p_new = tl.exp2(sc_new - m_new)
            l_i = l_i * alpha + p_new
            acc1 = acc1 * alpha[:, None] + p_new[:, None] * v1n.to(tl.float32)[None, :]
            acc2 = acc2 * alpha[:, None] + p_new[:, None] * v2n.to(tl.float32)[None, :]
            m_i = m_new
        out_row = out_ptr + b.to(tl.int64) * out_stride + q_cols
        if n_split == 1:
            tl.store(out_row, (acc1 / l_i[:, None]).to(dt), mask=g_mask[:, None])
            tl.store(out_row + HALF, (acc2 / l_i[:, None]).to(dt), mask=g_mask[:, None])
        else:
            rec: tl.constexpr = GP * (2 + HEAD)
            pair = b * num_kv_heads + h
            part = part_ptr + (pair * cap).to(tl.int64) * rec
            mine = part + s * rec
            tl.store(mine + offs_g, m_i)
            tl.store(mine + GP + offs_g, l_i)
            acc_cols = 2 * GP + offs_g[:, None] * HEAD + offs_d[None, :]  # [GP, HALF]
            tl.store(mine + acc_cols, acc1)
            tl.store(mine + acc_cols + HALF, acc2)
            tl.debug_barrier()  # every thread's partial is written before the arrival
            arrived = tl.atomic_add(cnt_ptr + pair, 1, sem="acq_rel")
            if arrived == n_split - 1:  # the last split merges every split at once
                offs_s = tl.arange(0, SPLITS)  # [SPLITS]
                s_mask = offs_s < n_split
                rows_s = part + offs_s * rec  # [SPLITS]
                m_s = tl.load(
                    rows_s[:, None] + offs_g[None, :],
                    mask=s_mask[:, None],
                    other=float("-inf"),
                    volatile=True,
                )  # [SPLITS, GP]
                l_s = tl.load(rows_s[:, None] + GP + offs_g[None, :], mask=s_mask[:, None],
                              other=0.0, volatile=True)  # fmt: skip
                m_all = tl.max(m_s, axis=0)  # [GP]
                w = tl.exp2(m_s - m_all[None, :])  # [SPLITS, GP], 0 on unused splits
                l_all = tl.sum(l_s * w, axis=0)  # [GP]
                a_ptrs = rows_s[:, None, None] + acc_cols[None, :, :]  # [SPLITS, GP, HALF]
                a1 = tl.load(a_ptrs, mask=s_mask[:, None, None], other=0.0, volatile=True)
                a2 = tl.load(a_ptrs + HALF, mask=s_mask[:, None, None], other=0.0, volatile=True)
                o1 = tl.sum(a1 * w[:, :, None], axis=0)  # [GP, HALF]
                o2 = tl.sum(a2 * w[:, :, None], axis=0)
                tl.store(out_row, (o1 / l_all[:, None]).to(dt), mask=g_mask[:, None])
                tl.store(out_row + HALF, (o2 / l_all[:, None]).to(dt), mask=g_mask[:, None])
                tl.atomic_xchg(cnt_ptr + pair, 0)  # ready for the next launch


def paged_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor | None,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    workspace: DecodeWorkspace,
    num_heads: int,
    scale: float,
    scratch_block: int,
    max_seq_len: int,
    tile: int | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """One decode token per row: rotate, write the cache, attend (see the module docstring).

    Args:
        query: [B, num_heads * D]; key, value: [B, num_kv_heads * D] (row-strided views of
            a fused qkv tensor are fine: unit column stride is required).
        positions: [B] int64, the new token's position (``seq_lens - 1`` on real rows).
        cos_sin_cache: [max_position, D] float32 (cos half then sin half) to apply NeoX
            RoPE to query and key, or None (no rotation: a partial rotary, whose table is
            narrower than D, rotates query and key before the call).
        kv_cache: [num_blocks + 1, 2, block_size, num_kv_heads, D] (FLASHINFER's NHD
            layout, key at index 0 of dim 1), query's dtype.
        block_tables: [B, width] int32, each row's blocks (covering position p).
        seq_lens: [B] int32 context length with the new token; 0 marks a padded lane.
        workspace: from :class:`DecodeWorkspace` with ``max_rows >= B``.
        scale: softmax scale; scratch_block: where padded lanes write.
        max_seq_len: a bound on every row's length (it sizes the grid; programs past a
            row's need exit, so the result does not depend on it).
        tile: context tokens per tile for every row (a power of two >= 16); default
            SHORT_TILE for rows of at most ``splits * SHORT_TILE`` tokens and
            :func:`tile_tokens` for longer ones (benchmarks/kernel_decode_attention.py
            sweeps it).
        splits: the most splits of one row (1 to MAX_SPLITS); default
            ``split_cap(B, num_kv_heads)``.
    Returns:
        [B, num_heads * D] in query's dtype.
    Raises:
        ValueError: shapes that disagree, D odd or not a power of two, a cos/sin table
            whose width is not D (partial rotary), B above the
            workspace's rows, or ``splits`` outside [1, MAX_SPLITS] or beyond the
            workspace's partial records.
    """
    rows = query.shape[0]
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    if query.shape[1] != num_heads * head_size or key.shape[1] != num_kv_heads * head_size:
        raise ValueError(
            f"query {tuple(query.shape)} / key {tuple(key.shape)} do not match {num_heads} "
            f"heads, {num_kv_heads} KV heads of size {head_size}"
        )
    if head_size % 2 or triton.next_power_of_2(head_size) != head_size:
        raise ValueError(f"head_size {head_size} must be a power of two")
    if cos_sin_cache is not None and cos_sin_cache.shape[-1] != head_size:
        raise ValueError(
            f"cos_sin_cache width (rotary_dim) {cos_sin_cache.shape[-1]} must equal head_size "
            f"{head_size}: the kernel rotates whole heads (rotate a partial rotary before the "
            "call and pass None)"
        )
    if rows > workspace.max_rows:
        raise ValueError(f"{rows} rows exceed the workspace's {workspace.max_rows}")
    if min(query.stride(1), key.stride(1), value.stride(1)) != 1:
        raise ValueError("query, key and value need unit column stride")
    cap = split_cap(rows, num_kv_heads) if splits is None else splits
    if not 1 <= cap <= MAX_SPLITS or rows * num_kv_heads * cap > workspace.records:
        raise ValueError(
            f"splits={cap} must be in [1, {MAX_SPLITS}] with {rows} rows x {num_kv_heads} "
            f"KV heads x splits <= the workspace's {workspace.records} records"
        )
    out = torch.empty(rows, num_heads * head_size, dtype=query.dtype, device=query.device)
    if rows == 0:
        return out
    group = num_heads // num_kv_heads
    gp, half = triton.next_power_of_2(group), head_size // 2
    rotate = cos_sin_cache is not None
    cs = cos_sin_cache if rotate else kv_cache
    st = kv_cache.stride()
    tile, short = decode_tiles(group, head_size, tile)
    pdl = pdl_enabled(query)
    grid = (rows, num_kv_heads, min(cap, num_splits(max_seq_len, short)))
    _paged_decode_kernel[grid](
        query, key, value, positions, cs, kv_cache, block_tables, seq_lens, out,
        workspace.partials, workspace.counters,
        query.stride(0), key.stride(0), value.stride(0), cs.stride(0) if rotate else 0,
        block_tables.stride(0), out.stride(0),
        st[0], st[1], st[2], scratch_block, scale * LOG2E, num_kv_heads, cap,
        GROUP=group, GP=gp, HALF=half, BS=block_size, BLOCK_T=tile, SHORT_T=short,
        ROTATE=rotate, SPLITS=MAX_SPLITS, PDL=pdl,
        num_warps=4, enable_fp_fusion=False, **launch_options(pdl),
    )  # fmt: skip
    return out
