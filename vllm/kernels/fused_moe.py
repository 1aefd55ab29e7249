"""Mixture-of-experts experts as Triton grouped GEMMs over (token, slot) pairs sorted by
expert.

Each token t routed to experts ``ids[t, 0..k-1]`` is k pairs ``p = t * k + j``.
:func:`align_block_size` sorts the pairs by expert and pads each expert's run to a multiple
of ``BLOCK_M`` (padding rows hold the sentinel ``T * k``), giving every ``BLOCK_M`` rows one
expert. :func:`fused_experts` then runs two launches of ``_expert_gemm``, one program per
(row block, column block): ``gate_up = x[token] @ w13[e].T`` for each pair, SiLU-and-mul in
torch, ``y = weight[p] * act @ w2[e].T``, and sums the k pair rows of each token.

Every shape is a function of T, k and E only (the grid covers the worst-case padded length
``T * k + E * (BLOCK_M - 1)``; blocks past the real end map to expert E and return at once,
so a batch of one token with k of E experts reads k experts' weights, not one tile per
worst-case block),
and nothing is read back to the host, so the whole path can be captured in a CUDA graph at
any batch size. Experts are read from their one stacked copy, each block only its expert.
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 32


def align_block_size(
    ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int64 -> (sorted_pairs [B * block_m] int32, block_expert [B] int32).

    ``sorted_pairs`` lists pair indices grouped by expert, each group padded to a multiple
    of ``block_m`` with ``T * k``; ``block_expert[b]`` is the expert of rows
    ``[b * block_m, (b + 1) * block_m)``, ``num_experts`` past the last group.
    ``B = cdiv(T * k + E * (block_m - 1), block_m)``.
    """
    num_pairs = ids.numel()
    device = ids.device
    flat = ids.reshape(-1)  # [n]
    order = torch.argsort(flat, stable=True)  # [n] pair indices by expert
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # [E]
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    padded_end = torch.cumsum(padded, 0)  # [E]
    padded_start = padded_end - padded
    start = torch.cumsum(counts, 0) - counts  # [E]
    expert_of = flat[order]  # [n]
    rank = torch.arange(num_pairs, device=device) - start[expert_of]  # [n]
    num_blocks = triton.cdiv(num_pairs + num_experts * (block_m - 1), block_m)
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs[padded_start[expert_of] + rank] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=device) * block_m  # [B]
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)  # [B]
    return sorted_pairs, block_expert.to(torch.int32)


@triton.jit
def _expert_gemm(
    a_ptr, w_ptr, c_ptr, pairs_ptr, block_expert_ptr, scale_ptr,
    N, K, num_pairs, num_experts, top_k, stride_am, stride_we, stride_wn, stride_cm,
    A_BY_TOKEN: tl.constexpr, SCALE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """c[p, n-block] = (scale[p] *) a[row(p)] @ w[e].T for the BM pairs p of this block."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= num_experts:  # a block past the last expert's run: no rows, no reads
        return
    pairs = tl.load(pairs_ptr + pid_m * BM + tl.arange(0, BM))  # [BM]
    valid = pairs < num_pairs  # [BM]
    a_rows = pairs // top_k if A_BY_TOKEN else pairs
    offs_n = pid_n * BN + tl.arange(0, BN)  # [BN]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)  # [BK]
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + offs_k[None, :],
            mask=valid[:, None] & (offs_k[None, :] < K), other=0.0,
        )  # [BM, BK]  # fmt: skip
        w = tl.load(
            w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None],
            mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0,
        )  # [BK, BN]  # fmt: skip
        acc += tl.dot(a, w)
    if SCALE:
        acc = acc * tl.load(scale_ptr + pairs, mask=valid, other=0.0)[:, None]
    tl.store(
        c_ptr + pairs[:, None] * stride_cm + offs_n[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=valid[:, None] & (offs_n[None, :] < N),
    )


def _gemm(a, w, out, sorted_pairs, block_expert, scale, top_k, by_token):
    num_pairs, n = out.shape
    grid = (block_expert.shape[0], triton.cdiv(n, BLOCK_N))
    _expert_gemm[grid](
        a, w, out, sorted_pairs, block_expert, scale if scale is not None else out,
        n, w.shape[2], num_pairs, w.shape[0], top_k, a.stride(0), w.stride(0), w.stride(1),
        out.stride(0), A_BY_TOKEN=by_token, SCALE=scale is not None,
        BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )  # fmt: skip


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU experts of routed tokens.

    Args:
        x: [T, H] activations. w13: [E, 2I, H] (gate rows, then up rows). w2: [E, H, I].
        weights: [T, k] routing weights (x's dtype or float32). ids: [T, k] int64 experts.

    Returns:
        [T, H] in x's dtype: ``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``.

    Raises:
        ValueError: inner sizes that do not match or tensors that are not contiguous.
    """
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    if w13.shape[2] != hidden or w2.shape != (num_experts, hidden, two_inter // 2):
        raise ValueError(
            f"expert shapes w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not fit x "
            f"{tuple(x.shape)}"
        )
    if not (x.is_contiguous() and w13.is_contiguous() and w2.is_contiguous()):
        raise ValueError("fused_experts needs contiguous x, w13 and w2")
    top_k = ids.shape[1]
    sorted_pairs, block_expert = align_block_size(ids, num_experts)
    gate_up = torch.empty(num_tokens * top_k, two_inter, dtype=x.dtype, device=x.device)
    _gemm(x, w13, gate_up, sorted_pairs, block_expert, None, top_k, True)
    gate, up = gate_up.chunk(2, dim=-1)  # [T * k, I] each
    act = (torch.nn.functional.silu(gate) * up).contiguous()  # [T * k, I]
    out = torch.empty(num_tokens * top_k, hidden, dtype=x.dtype, device=x.device)
    scale = weights.reshape(-1).to(torch.float32).contiguous()  # [T * k]
    _gemm(act, w2, out, sorted_pairs, block_expert, scale, top_k, False)
    return out.view(num_tokens, top_k, hidden).sum(dim=1)  # [T, H]
