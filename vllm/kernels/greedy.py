"""Greedy sampling's packed rows in two Triton launches: each row's first argmax, the
logprob of that token and its rank (1).

Why: at decode with few rows, ``Sampler.sample_on_device`` on an all-greedy batch without
top logprobs ran ``argmax`` and ``log_softmax`` as one-CTA-per-row reductions over the whole
vocabulary (SmolLM2's 49152: 12.9 and 10.2 us a token on an H200, bf16, profile_decode.py),
then a gather, two casts and a concatenation: about 30 us of a 0.6-1 ms token. Here:

1. :func:`_chunk_kernel`, grid (rows, chunks of ``BLOCK_V`` logits): the chunk's max, the
   first index holding it, and ``sum(exp(x - max))``.
2. :func:`_merge_kernel`, grid (rows,): ``M`` = the max over chunks, the token = the lowest
   index among the chunks whose max is ``M`` (chunks are in vocabulary order, so this is
   ``torch.argmax``'s first maximal index), ``S = sum_c s_c * exp(m_c - M)`` and the
   logprob ``-log(S)``: ``log_softmax(x)[token] = x[token] - M - log(S)`` with
   ``x[token] = M``. Writes the ids [rows] int64 and the packed rows [rows, 3] float64
   (id, logprob, rank 1) as ``sampler._pack_logprobs`` lays them out with k = 0.

The token ids equal ``torch.argmax`` exactly (ties: the first index; NaN logits are not
supported). The logprob is torch's ``log_softmax`` at that token up to float32 rounding of
a different summation order and Triton's ``exp`` (a few ulp, not bit-equal). A row whose
logits are all ``-inf`` gives token 0 and a NaN logprob, as torch does.

Used by ``Sampler.sample_on_device`` for all-greedy batches without logprobs on CUDA, in
eager steps, graphs and decode-loop graphs alike. A decode-loop graph hands it the lm_head's
16-bit logits: the float32 copy the other paths make (at 256 rows of a 151,936-token
vocabulary, 156 MB written and read again each step) is skipped, and the ids are the same.
This module imports ``triton`` at the top: reach it through
:func:`vllm.kernels.dispatch.get_triton_greedy`.
"""

import torch
import triton
import triton.language as tl

BLOCK_V = 4096  # logits per chunk program (16 KiB of float32)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _chunk_kernel(x_ptr, m_ptr, s_ptr, i_ptr, V, x_stride, CHUNKS, BLOCK_V: tl.constexpr):
    """Program (row, c): max, first index of the max and sum(exp(x - max)) of logits
    [c * BLOCK_V, (c + 1) * BLOCK_V) of ``row``; stored at [row * CHUNKS + c]."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK_V + tl.arange(0, BLOCK_V)  # [BV] vocabulary indices
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + offs, mask=offs < V, other=-float("inf"))
    x = x.to(tl.float32)  # [BV]; 16-bit logits are widened here, exactly
    m = tl.max(x, axis=0)
    first = tl.min(tl.where(x == m, offs, V), axis=0)  # the chunk's first maximal index
    s = tl.sum(tl.exp(x - m), axis=0)
    s = tl.where(m == -float("inf"), 0.0, s)  # an all -inf chunk adds nothing
    out = row * CHUNKS + c
    tl.store(m_ptr + out, m)
    tl.store(s_ptr + out, s)
    tl.store(i_ptr + out, first)


@triton.jit
def _merge_kernel(m_ptr, s_ptr, i_ptr, ids_ptr, packed_ptr, V, CHUNKS,
                  CHUNKS_POW2: tl.constexpr):  # fmt: skip
    """Program ``row``: the row's first argmax and its logprob from the chunk partials."""
    row = tl.program_id(0)
    cs = tl.arange(0, CHUNKS_POW2)  # [CP]
    ok = cs < CHUNKS
    base = row * CHUNKS
    m = tl.load(m_ptr + base + cs, mask=ok, other=-float("inf"))  # [CP]
    s = tl.load(s_ptr + base + cs, mask=ok, other=0.0)
    idx = tl.load(i_ptr + base + cs, mask=ok, other=V)
    big = tl.max(m, axis=0)
    token = tl.min(tl.where(m == big, idx, V), axis=0)
    total = tl.sum(s * tl.exp(m - big), axis=0)
    lp = -tl.log(total)
    tl.store(ids_ptr + row, token.to(tl.int64))
    dst = packed_ptr + row * 3
    tl.store(dst, token.to(tl.float64))
    tl.store(dst + 1, lp.to(tl.float64))
    tl.store(dst + 2, tl.full([], 1.0, tl.float64))


def greedy_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and their packed rows.

    Args:
        x: [rows, vocab] logits (after penalties), float32, or bfloat16 / float16 as the
            lm_head wrote them (each chunk program widens them to float32 on load, so the
            ids are those of the float32 copy; the decode-loop graph passes them so, which
            saves writing and reading that copy), unit column stride, on CUDA (or on CPU
            under ``TRITON_INTERPRET=1``); vocab < 2**31.
    Returns:
        (ids [rows] int64, packed [rows, 3] float64: token id, its log_softmax value, 1.0).
    Raises:
        ValueError: ``x`` is not 2-D float32 / bfloat16 / float16 with a unit column
            stride, or has no columns.
    """
    if x.dim() != 2 or x.dtype not in _DTYPES or x.stride(1) != 1 or x.shape[1] == 0:
        raise ValueError(
            f"x must be [rows, vocab > 0] float32, bfloat16 or float16 with unit column "
            f"stride, got {tuple(x.shape)} {x.dtype} strides {x.stride()}"
        )
    rows, vocab = x.shape
    ids = torch.empty(rows, dtype=torch.long, device=x.device)  # [rows]
    packed = torch.empty(rows, 3, dtype=torch.float64, device=x.device)  # [rows, 3]
    if rows == 0:
        return ids, packed
    chunks = triton.cdiv(vocab, BLOCK_V)
    part = torch.empty(2, rows * chunks, dtype=torch.float32, device=x.device)  # m, s
    first = torch.empty(rows * chunks, dtype=torch.int32, device=x.device)
    _chunk_kernel[(rows, chunks)](
        x, part[0], part[1], first, vocab, x.stride(0), chunks, BLOCK_V=BLOCK_V, num_warps=4
    )
    _merge_kernel[(rows,)](
        part[0], part[1], first, ids, packed, vocab, chunks,
        CHUNKS_POW2=triton.next_power_of_2(chunks), num_warps=1,
    )  # fmt: skip
    return ids, packed
