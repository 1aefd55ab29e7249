"""Fused Triton kernels for the decoder's elementwise ops: RMSNorm, SiLU-and-mul, NeoX RoPE.

Why: a small model's decode step (SmolLM2-135M: 30 layers, hidden 576) is bound by the
number of kernels in its CUDA graph, not by bytes or FLOPs. The torch forms launch ~9
kernels per RMSNorm, ~17 per rotary call and 2 per SiLU-and-mul; each op here is ONE
launch. Arithmetic is float32 inside the kernel, rounded to the storage dtype at exactly
the points where the torch reference (the modules' ``forward_native``, itself equal to
Hugging Face) rounds. Rotary is bit-identical to it; RMSNorm and SiLU-and-mul are too,
except where a float32 sum or ``rsqrt`` / ``exp`` differs in its last bit and flips a
rounding (rare in bf16; ~1e-6 relative in float32).

This module imports ``triton`` at the top: import it only through
:func:`vllm.kernels.dispatch.get_triton_ops`, which keeps installs
without Triton working. Rows / tokens may be any count; 0 returns empties with no launch.
The only ``triton.language`` features used: ``program_id``, ``arange``, ``load`` / ``store``
with masks, ``sum``, ``exp``, ``rsqrt``, ``.to`` casts, ``constexpr`` block sizes (from
``triton.next_power_of_2``), a ``@triton.jit`` helper called from a kernel; launches take
``num_warps`` and (rotary) ``enable_fp_fusion=False``.
"""

import torch
import triton
import triton.language as tl


def _num_warps(block: int) -> int:
    """Warps for a program over ``block`` elements: one per 256, between 1 and 8."""
    return max(1, min(8, block // 256))


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    x_stride, res_stride, out_stride, res_out_stride,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per row: [optional residual add] -> RMSNorm -> * weight."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        # torch's `residual + x`: an exact-operand float32 add, rounded once to the dtype.
        s = (r + x).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * res_out_stride + cols, s, mask=mask)
        x = s.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden  # masked lanes hold 0
    normed = x * tl.rsqrt(variance + eps)
    # Cast back to the input dtype BEFORE the weight multiply (HF LlamaRMSNorm).
    if HAS_RESIDUAL:
        normed = normed.to(res_out_ptr.dtype.element_ty).to(tl.float32)
    else:
        normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as [rows, last] with unit column stride (a view when possible, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2, -1) + eps)).to(x.dtype)`` in one launch.

    Args:
        x: [..., hidden] float32 / bfloat16 / float16 on CUDA (any row stride).
        weight: [hidden].
        eps: added to the mean square (Zhang & Sennrich 2019; HF ``LlamaRMSNorm``).

    Returns:
        [..., hidden], dtype ``promote_types(x.dtype, weight.dtype)`` (= x.dtype for a
        model whose weights share its activation dtype), as the torch reference.
    """
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel() == 0:
        return out
    hidden = x.shape[-1]
    x2 = _rows(x)  # [rows, hidden]
    out2 = out.view(-1, hidden)  # [rows, hidden]
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, x2, weight, out2, out2,
        x2.stride(0), 0, out2.stride(0), 0,
        hidden, eps,
        HAS_RESIDUAL=False, BLOCK=block, num_warps=_num_warps(block),
    )  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x``; returns ``(rms_norm(s, weight, eps), s)`` in one launch.

    Args:
        x, residual: [..., hidden], same shape, on CUDA; the inputs are not modified.
        weight: [hidden].
        eps: as :func:`rms_norm`.

    Returns:
        (normed [..., hidden], s [..., hidden]): ``s`` in ``promote_types(residual, x)``,
        ``normed`` in ``promote_types(s.dtype, weight.dtype)``.

    Raises:
        ValueError: ``x`` and ``residual`` shapes differ.
    """
    if x.shape != residual.shape:
        raise ValueError(f"x shape {tuple(x.shape)} != residual shape {tuple(residual.shape)}")
    sum_dtype = torch.promote_types(residual.dtype, x.dtype)
    res_out = torch.empty(x.shape, dtype=sum_dtype, device=x.device)
    out = torch.empty(x.shape, dtype=torch.promote_types(sum_dtype, weight.dtype), device=x.device)
    if x.numel() == 0:
        return out, res_out
    hidden = x.shape[-1]
    x2, r2 = _rows(x), _rows(residual)  # [rows, hidden] each
    out2, res_out2 = out.view(-1, hidden), res_out.view(-1, hidden)  # [rows, hidden] each
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, out2, res_out2,
        x2.stride(0), r2.stride(0), out2.stride(0), res_out2.stride(0),
        hidden, eps,
        HAS_RESIDUAL=True, BLOCK=block, num_warps=_num_warps(block),
    )  # fmt: skip
    return out, res_out


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, d, BLOCK: tl.constexpr):
    """Program (row, block of d): out = (silu(gate) rounded to dtype) * up, rounded again."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    # torch's F.silu: x / (1 + exp(-x)) in float32, rounded to the dtype; then the multiply.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate (Shazeer 2020): ``silu(x[..., :d]) * x[..., d:]`` in one launch.

    Args:
        x: [..., 2 * d] on CUDA, gate half first (the fused gate_up projection's output).

    Returns:
        [..., d] in x.dtype; silu computed in float32 and rounded to x.dtype before the
        multiply, as torch does for bf16 / fp16.

    Raises:
        ValueError: an odd last dimension.
    """
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension, got {x.shape[-1]}")
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = _rows(x)  # [rows, 2 * d]
    out2 = out.view(-1, d)  # [rows, d]
    block = min(triton.next_power_of_2(d), 1024)
    grid = (x2.shape[0], triton.cdiv(d, block))
    _silu_and_mul_kernel[grid](
        x2, out2, x2.stride(0), out2.stride(0), d, BLOCK=block, num_warps=_num_warps(block)
    )
    return out


@triton.jit
def rope_halves(x1, x2, c, s, dt: tl.constexpr):
    """NeoX rotation of float32 halves ``x1``, ``x2`` by ``c`` = cos, ``s`` = sin
    (broadcastable, already rounded to ``dt``): returns ``(x1 c - x2 s, x2 c + x1 s)`` in
    ``dt``, each product and each sum rounded to ``dt`` as torch's elementwise ops on ``dt``
    do (no FMA contraction: launch with ``enable_fp_fusion=False``)."""
    x1c, x2s = (x1 * c).to(dt).to(tl.float32), (x2 * s).to(dt).to(tl.float32)
    x2c, x1s = (x2 * c).to(dt).to(tl.float32), (x1 * s).to(dt).to(tl.float32)
    return (x1c - x2s).to(dt), (x2c + x1s).to(dt)


@triton.jit
def _rotate_heads(
    ptr, row, stride, num_heads, cos, sin, head_size, half, offs_h, offs_d,
    dst_ptr, dst_off, WRITE_DST: tl.constexpr,
):  # fmt: skip
    """Rotate the ``num_heads`` heads of one token row in place (NeoX halves of the first
    ``2 * half`` channels, the rotary dim; the rest of each head is not touched); with
    ``WRITE_DST`` also store the rotated channels at ``dst_ptr + dst_off`` (a KV-cache row).

    Rounds like torch's elementwise ops on the storage dtype: each product and each sum is
    computed in float32 (exact for bf16 operands) and rounded to the dtype (no-ops for
    float32), so bf16 / fp16 results equal ``RotaryEmbedding.forward_native`` bit for bit.
    """
    dt = ptr.dtype.element_ty
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)  # [HEADS, HALF]
    cols = offs_h[:, None] * head_size + offs_d[None, :]  # [HEADS, HALF]
    first = ptr + row * stride + cols  # [HEADS, HALF]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = rope_halves(x1, x2, cos[None, :], sin[None, :], dt)
    tl.store(first, y1, mask=mask)
    tl.store(first + half, y2, mask=mask)
    if WRITE_DST:
        tl.store(dst_ptr + dst_off + cols, y1, mask=mask)
        tl.store(dst_ptr + dst_off + cols + half, y2, mask=mask)


@triton.jit
def _copy_heads(
    src_ptr, dst_ptr, num_heads, head_size, start, width, offs_h, offs_p,
):  # fmt: skip
    """Copy channels ``[start, start + width)`` of each of ``num_heads`` heads (of size
    ``head_size``) from the row at ``src_ptr`` to the row at ``dst_ptr``; ``offs_p`` spans
    at least ``width``."""
    mask = (offs_h[:, None] < num_heads) & (offs_p[None, :] < width)  # [HEADS, PASS]
    cols = offs_h[:, None] * head_size + start + offs_p[None, :]  # [HEADS, PASS]
    tl.store(dst_ptr + cols, tl.load(src_ptr + cols, mask=mask), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, v_ptr, kv_ptr, rows_ptr,
    q_stride, k_stride, cache_stride, v_stride, kv_stride, rows_stride,
    num_q_heads, num_kv_heads, head_size, rotary_dim,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    PASS: tl.constexpr, PARTIAL: tl.constexpr, WRITE_KV: tl.constexpr,
):  # fmt: skip
    """One program per token: rotates the first ``rotary_dim`` channels of all its query
    heads and key heads (the others are left as they are); with ``WRITE_KV`` also stores
    the key (rotated part and, with ``PARTIAL``, the rest) and the value into their
    KV-cache rows (``rows_ptr``: [2, T] int64, key rows then value rows, of the flat
    cache). ``PASS``: a power of two >= head_size - rotary_dim."""
    row = tl.program_id(0).to(tl.int64)
    half = rotary_dim // 2
    offs_d = tl.arange(0, HALF)  # [HALF]
    offs_kv = tl.arange(0, KV_HEADS)  # [KV_HEADS]
    pos = tl.load(pos_ptr + row).to(tl.int64)
    cs = cache_ptr + pos * cache_stride + offs_d  # cos half then sin half
    cos = tl.load(cs, mask=offs_d < half, other=0.0)  # [HALF]
    sin = tl.load(cs + half, mask=offs_d < half, other=0.0)
    # HF rounds cos/sin to the activation (query) dtype before applying them.
    cos = cos.to(q_ptr.dtype.element_ty).to(tl.float32)
    sin = sin.to(q_ptr.dtype.element_ty).to(tl.float32)
    _rotate_heads(
        q_ptr, row, q_stride, num_q_heads, cos, sin, head_size, half, tl.arange(0, Q_HEADS),
        offs_d, q_ptr, 0, False,
    )  # fmt: skip
    k_off = 0
    if WRITE_KV:
        k_off = tl.load(rows_ptr + row) * kv_stride
    _rotate_heads(
        k_ptr, row, k_stride, num_kv_heads, cos, sin, head_size, half, offs_kv, offs_d,
        kv_ptr, k_off, WRITE_KV,
    )  # fmt: skip
    if WRITE_KV:  # the value row is copied as is, in two halves like the key
        v_off = tl.load(rows_ptr + rows_stride + row) * kv_stride
        mask = (offs_kv[:, None] < num_kv_heads) & (offs_d[None, :] < half)  # [KV, HALF]
        cols = offs_kv[:, None] * head_size + offs_d[None, :]  # [KV_HEADS, HALF]
        src = v_ptr + row * v_stride + cols
        tl.store(kv_ptr + v_off + cols, tl.load(src, mask=mask), mask=mask)
        tl.store(kv_ptr + v_off + cols + half, tl.load(src + half, mask=mask), mask=mask)
        if PARTIAL:  # channels [rotary_dim, head_size) of the key (not rotated) and value
            offs_p = tl.arange(0, PASS)  # [PASS]
            width = head_size - rotary_dim
            _copy_heads(k_ptr + row * k_stride, kv_ptr + k_off, num_kv_heads, head_size,
                        rotary_dim, width, offs_kv, offs_p)  # fmt: skip
            _copy_heads(v_ptr + row * v_stride, kv_ptr + v_off, num_kv_heads, head_size,
                        rotary_dim, width, offs_kv, offs_p)  # fmt: skip


def _as_head_rows(x: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """``x`` as [num_tokens, heads * head_size] with unit column stride; a view when the
    input already is one (so writes reach the caller's tensor), else a copy."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    return x.reshape(num_tokens, -1).contiguous()


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    value: torch.Tensor | None = None,
    kv_cache: torch.Tensor | None = None,
    kv_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX-style RoPE (Su et al. 2021; HF ``rotate_half``) on query AND key, one launch;
    optionally also the KV-cache write of the rotated key and the value (same launch).

    Per head, ``x1 = x[:R/2]``, ``x2 = x[R/2:R]``, ``cos, sin = cache[pos]`` halves::

        out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[R:]]

    where R = ``cos_sin_cache.shape[-1]``, the rotary dim: the whole head (R = D), or its
    first R channels for a partial rotary (Phi-4-mini), whose other channels are left
    unchanged (and written to the cache unchanged).

    with torch's rounding points (cos/sin rounded to the query dtype as HF does, then each
    product and sum rounded to the dtype; float32 arithmetic inside; FMA contraction off
    at launch), so bf16 and float32 results equal the torch path bit for bit (checked on
    an H200). Rounding once instead was tried: on a random SmolLM2-shaped
    bf16 model it moved logits by up to 10 (attention near one-hot amplifies 1-ulp q/k
    changes) and broke greedy parity with Hugging Face, which the torch path has.

    IN PLACE: when ``query`` / ``key`` are 2-D with unit column stride (e.g. column slices
    of a fused qkv tensor, row stride q_size + 2 * kv_size) the rotation is written into
    them and the same tensors are returned; other layouts are rotated on a contiguous copy.
    Always use the returned tensors; the un-rotated values are not kept.

    Args:
        positions: [T] integer, each in [0, cos_sin_cache.shape[0]) (not checked: a
            GPU-side bound check would need a host sync).
        query: [T, num_heads * head_size]; key: [T, num_kv_heads * head_size]; on CUDA.
        cos_sin_cache: [max_position, R], cos half then sin half (float32); R even, at
            most D.
        head_size: D.
        value: [T, num_kv_heads * head_size] (unit column stride), with ``kv_cache`` and
            ``kv_rows``: token t's rotated key goes to ``kv_cache[kv_rows[0, t]]`` and its
            value to ``kv_cache[kv_rows[1, t]]``.
        kv_cache: [cache rows, num_kv_heads * head_size] contiguous, key's dtype (a flat
            view of a paged cache, e.g. FlashInfer's NHD layout, see its ``slot_rows_host``).
        kv_rows: [2, T] int64 rows of ``kv_cache`` (not bound-checked, as positions).

    Returns:
        (query, key) rotated, same shapes and dtypes as the inputs.

    Raises:
        ValueError: mismatched token counts, a width that is not a multiple of D, a
            rotary dim that is odd or above D, or cache arguments that do not fit (shape,
            dtype, only some of the three given).
    """
    num_tokens = positions.shape[0]
    if query.shape[0] != num_tokens or key.shape[0] != num_tokens:
        raise ValueError(
            f"positions has {num_tokens} tokens but query {tuple(query.shape)} and key "
            f"{tuple(key.shape)} (first dimension must match)"
        )
    rotary_dim = cos_sin_cache.shape[-1]
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_size:
        raise ValueError(
            f"cos_sin_cache width (rotary_dim) {rotary_dim} must be even and in "
            f"[2, head_size={head_size}]"
        )
    if num_tokens == 0:
        return query, key
    q, k = _as_head_rows(query, num_tokens), _as_head_rows(key, num_tokens)
    if q.shape[1] % head_size or k.shape[1] % head_size:
        raise ValueError(
            f"query width {q.shape[1]} and key width {k.shape[1]} must be multiples of "
            f"head_size {head_size}"
        )
    num_q_heads, num_kv_heads = q.shape[1] // head_size, k.shape[1] // head_size
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half_block = triton.next_power_of_2(rotary_dim // 2)
    partial = rotary_dim < head_size
    pass_block = triton.next_power_of_2(head_size - rotary_dim) if partial else 1
    q_block = triton.next_power_of_2(num_q_heads)
    write = _check_kv_write(value, kv_cache, kv_rows, k, num_tokens)
    v, kv, rows = (value, kv_cache, kv_rows) if write else (k, k, positions)
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cache, v, kv, rows,
        q.stride(0), k.stride(0), cache.stride(0), v.stride(0), kv.stride(0),
        rows.stride(0) if write else 0,
        num_q_heads, num_kv_heads, head_size, rotary_dim,
        Q_HEADS=q_block, KV_HEADS=triton.next_power_of_2(num_kv_heads), HALF=half_block,
        PASS=pass_block, PARTIAL=partial, WRITE_KV=write,
        num_warps=_num_warps(q_block * half_block),
        enable_fp_fusion=False,  # else mul + sub contract to an FMA: torch rounds the product
    )  # fmt: skip
    return q.view(query.shape), k.view(key.shape)


def _check_kv_write(value, kv_cache, kv_rows, k: torch.Tensor, num_tokens: int) -> bool:
    """Whether rotary_embedding also writes the cache; raises ValueError on bad arguments."""
    given = [x is not None for x in (value, kv_cache, kv_rows)]
    if not any(given):
        return False
    if not all(given):
        raise ValueError("value, kv_cache and kv_rows must be given together (or none)")
    if value.shape != k.shape or value.stride(1) != 1:
        raise ValueError(
            f"value {tuple(value.shape)} must match key {tuple(k.shape)} with unit column stride"
        )
    if kv_cache.dim() != 2 or kv_cache.shape[1] != k.shape[1] or not kv_cache.is_contiguous():
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} must be contiguous [rows, {k.shape[1]}]"
        )
    if kv_cache.dtype != k.dtype:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} differs from key dtype {k.dtype}")
    if tuple(kv_rows.shape) != (2, num_tokens) or kv_rows.stride(1) != 1:
        raise ValueError(f"kv_rows {tuple(kv_rows.shape)} must be [2, {num_tokens}]")
    return True
