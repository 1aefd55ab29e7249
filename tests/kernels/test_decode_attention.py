"""The small-batch paged decode kernel (vllm/kernels/decode_attention.py).

Reference: ``RotaryEmbedding.forward_native`` for the rotation (the cache must hold the
rotated key bit for bit in float32) and plain float64 softmax attention over each row's
context gathered through its block table. CPU: the kernel under ``TRITON_INTERPRET=1``
(tests.utils.run_interpreted), float32. GPU (``gpu`` marker): compiled, float32 and
bfloat16 (where the rotated key is bit-identical to the torch path too).
"""

import importlib.util
import math

import pytest
import torch

from tests.utils import run_interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

BLOCK = 16


def _setup(lens, heads, kv_heads, d, dtype, device, seed=0, rotary_dim=None):
    """Random q/k/v rows, a cache with random context, shuffled block tables; RoPE over
    the first ``rotary_dim`` channels of each head (default all ``d``)."""
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    gen = torch.Generator().manual_seed(seed)
    rows = len(lens)
    blocks_per_row = [max(1, math.ceil(n / BLOCK)) for n in lens]
    num_blocks = sum(blocks_per_row) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_row)
    tables = torch.zeros(rows, width, dtype=torch.int32)
    used = 0
    for r, nb in enumerate(blocks_per_row):
        tables[r, :nb] = torch.tensor(perm[used : used + nb], dtype=torch.int32)
        used += nb
    scratch = num_blocks  # the extra block of the cache
    cache = torch.randn(num_blocks + 1, 2, BLOCK, kv_heads, d, generator=gen).to(dtype)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    rope = RotaryEmbedding(d, rotary_dim or d, 16384, {"rope_theta": 1e4, "rope_type": "default"})
    positions = torch.tensor([max(n - 1, 0) for n in lens], dtype=torch.long)
    to = dict(device=device)
    return dict(
        qkv=qkv.to(**to), cache=cache.to(**to), tables=tables.to(**to),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        positions=positions.to(**to), rope=rope.to(**to), scratch=scratch,
        heads=heads, kv_heads=kv_heads, d=d,
    )  # fmt: skip


def _split(s):
    q_size, kv = s["heads"] * s["d"], s["kv_heads"] * s["d"]
    return s["qkv"].split([q_size, kv, kv], dim=-1)


def _run(s, bound=None, rows=None, splits=None):
    from vllm.kernels import decode_attention as td

    q, k, v = _split(s)
    ws = td.DecodeWorkspace(8, s["heads"], s["kv_heads"], s["d"], q.device)
    if bound is None:
        bound = int(s["seq_lens"].max())
    sel = slice(None) if rows is None else rows
    out = td.paged_decode_attention(
        q[sel], k[sel], v[sel], s["positions"][sel], s["rope"].cos_sin_cache, s["cache"],
        s["tables"][sel], s["seq_lens"][sel], ws, s["heads"], s["d"] ** -0.5, s["scratch"],
        bound, splits=splits,
    )  # fmt: skip
    assert int(ws.counters.abs().sum()) == 0, "a launch must leave the split counters at 0"
    return out


def _run_small_decode_impl(s):
    """FLASHINFER's small-decode attention (``SmallDecodeImpl.forward``) over the rows of
    ``s``, with ``s["rope"]`` as the layer's rotary embedding: [rows, H*D]."""
    from types import SimpleNamespace

    from vllm.attention.backends.abstract import ForwardMode
    from vllm.attention.backends.flashinfer.small_decode import (
        SmallDecodeImpl,
        SmallDecodeMetadata,
    )
    from vllm.kernels import decode_attention as td

    q, k, v = _split(s)
    rows = q.shape[0]
    md = SmallDecodeMetadata(
        mode=ForwardMode.DECODE, num_rows=rows, num_tokens=rows,
        slot_mapping=torch.zeros(rows, dtype=torch.long), scratch_slot=s["scratch"] * BLOCK,
        seq_lens=s["seq_lens"], block_tables=s["tables"], block_size=BLOCK,
        max_seq_len=int(s["seq_lens"].max()),
        workspace=td.DecodeWorkspace(8, s["heads"], s["kv_heads"], s["d"], q.device),
    )  # fmt: skip
    layer = SimpleNamespace(num_heads=s["heads"], scale=s["d"] ** -0.5)
    return SmallDecodeImpl.forward(layer, q, k, v, s["cache"], md, s["positions"], s["rope"])


def _reference(s, cache_before):
    """(expected output [rows, H*D] float64, expected cache) from the torch path."""
    q, k, v = _split(s)
    qr, kr = s["rope"].forward_native(s["positions"], q, k)
    h, hk, d = s["heads"], s["kv_heads"], s["d"]
    cache = cache_before.clone()
    outs = []
    for r, n in enumerate(s["seq_lens"].tolist()):
        p = int(s["positions"][r])
        if n > 0:
            blk, off = int(s["tables"][r, p // BLOCK]), p % BLOCK
        else:
            blk, off = s["scratch"], 0
        cache[blk, 0, off] = kr[r].view(hk, d)
        cache[blk, 1, off] = v[r].view(hk, d)
        ctx = max(n, 1)
        if n > 0:
            idx = [int(s["tables"][r, t // BLOCK]) for t in range(ctx)]
            keys = torch.stack([cache[idx[t], 0, t % BLOCK] for t in range(ctx)])  # [ctx, hk, d]
            vals = torch.stack([cache[idx[t], 1, t % BLOCK] for t in range(ctx)])
        else:
            keys, vals = kr[r].view(1, hk, d), v[r].view(1, hk, d)
        qh = qr[r].view(h, d).double()
        kk = keys.double().repeat_interleave(h // hk, dim=1)  # [ctx, h, d]
        vv = vals.double().repeat_interleave(h // hk, dim=1)
        att = torch.einsum("hd,thd->ht", qh, kk) * d**-0.5
        outs.append(torch.einsum("ht,thd->hd", att.softmax(-1), vv).reshape(-1))
    return torch.stack(outs), cache


def interpreted_float32_cases():
    # lengths: 1 token, short, a block edge, many one-tile splits, a padded lane (0)
    lens = [1, 5, 16, 300, 0]
    s = _setup(lens, heads=6, kv_heads=2, d=16, dtype=torch.float32, device="cpu")
    before = s["cache"].clone()
    want, want_cache = _reference(s, before)
    got = _run(s)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # the cache holds exactly the torch-rotated key and the value at each new slot
    assert torch.equal(s["cache"], want_cache), "cache write differs from the torch rotation"
    # one row alone gives the same bits as in the batch, and the grid size does not matter
    for r in range(len(lens)):
        s["cache"].copy_(before)
        alone = _run(s, rows=slice(r, r + 1))
        assert torch.equal(alone[0], got[r]), f"row {r} depends on the batch"
    s["cache"].copy_(before)
    assert torch.equal(_run(s, bound=8192), got), "result depends on the grid's split count"
    # GQA group 3 (padded to 4 lanes) and no rotation
    s = _setup([7, 40], heads=9, kv_heads=3, d=8, dtype=torch.float32, device="cpu", seed=1)
    want, _ = _reference(s, s["cache"].clone())
    torch.testing.assert_close(_run(s).double(), want, rtol=1e-5, atol=1e-5)
    # a partial rotary (Phi-4-mini's: 3/4 of each head) on FLASHINFER's small-decode path:
    # rotated before the kernel (which rotates whole heads only), then attended and cached
    s = _setup([5, 40, 0], heads=4, kv_heads=2, d=16, dtype=torch.float32, device="cpu",
               seed=4, rotary_dim=12)  # fmt: skip
    want, want_cache = _reference(s, s["cache"].clone())
    torch.testing.assert_close(_run_small_decode_impl(s).double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(s["cache"], want_cache), "partial rotary: cache write differs"


def interpreted_long_row():
    """A row longer than MAX_SPLITS tiles: the chunk grows, 32 splits merge."""
    from vllm.kernels import decode_attention as td

    n = td.MAX_SPLITS * td.tile_tokens(2, 8) + 300
    s = _setup([n], heads=2, kv_heads=1, d=8, dtype=torch.float32, device="cpu", seed=2)
    want, _ = _reference(s, s["cache"].clone())
    torch.testing.assert_close(_run(s).double(), want, rtol=1e-5, atol=1e-5)


def interpreted_errors():
    from vllm.kernels import decode_attention as td

    s = _setup([3, 4], heads=4, kv_heads=2, d=16, dtype=torch.float32, device="cpu")
    q, k, v = _split(s)
    ws = td.DecodeWorkspace(1, 4, 2, 16, "cpu")
    args = (s["positions"], None, s["cache"], s["tables"], s["seq_lens"], ws, 4, 0.25, 0, 1)
    with pytest.raises(ValueError, match="2 rows exceed the workspace's 1"):
        td.paged_decode_attention(q, k, v, *args)
    with pytest.raises(ValueError, match="do not match 4 heads"):
        td.paged_decode_attention(q[:, :32], k, v, *args)
    narrow = s["rope"].cos_sin_cache[:, :12]  # a partial rotary's table: refused, not misread
    with pytest.raises(ValueError, match=r"width \(rotary_dim\) 12 must equal head_size 16"):
        td.paged_decode_attention(q, k, v, args[0], narrow, *args[2:])
    ws = td.DecodeWorkspace(2, 4, 2, 16, "cpu")
    args = (s["positions"], None, s["cache"], s["tables"], s["seq_lens"], ws, 4, 0.25, 0, 1)
    with pytest.raises(ValueError, match="splits=33 must be in"):
        td.paged_decode_attention(q, k, v, *args, splits=33)
    with pytest.raises(ValueError, match="splits=0 must be in"):
        td.paged_decode_attention(q, k, v, *args, splits=0)
    ws.records = 2 * 2 * 4  # room for 4 splits of 2 rows x 2 KV heads only
    with pytest.raises(ValueError, match="workspace's 16 records"):
        td.paged_decode_attention(q, k, v, *args, splits=5)


def interpreted_split_caps():
    """Capped splits (large batches): one split a row, and three (a 300-token row cut
    into three chunks, merged), both against the reference."""
    s = _setup([1, 5, 300, 0], heads=4, kv_heads=2, d=16, dtype=torch.float32, device="cpu",
               seed=3)  # fmt: skip
    before = s["cache"].clone()
    want, want_cache = _reference(s, before)
    for splits in (1, 3):
        s["cache"].copy_(before)
        torch.testing.assert_close(_run(s, splits=splits).double(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(s["cache"], want_cache)


def test_split_cap():
    """32 splits up to 32 (row, KV head) pairs (rows rounded up to a power of two), then
    1024 // pairs; a row count and the captured size it pads to (within its power of two)
    get the same cap."""
    from vllm.kernels import decode_attention as td

    assert td.split_cap(1, 8) == td.split_cap(4, 8) == td.MAX_SPLITS
    assert td.split_cap(16, 2) == td.MAX_SPLITS
    assert [td.split_cap(r, 2) for r in (17, 32, 33, 64, 128, 256, 512)] == [16, 16, 8, 8, 4, 2, 1]
    assert td.split_cap(100, 2) == td.split_cap(104, 2) == td.split_cap(128, 2) == 4
    assert td.split_cap(64, 3) == 5 and td.split_cap(4096, 8) == 1
    ws = td.DecodeWorkspace(100, 14, 2, 64, "cpu")
    assert ws.records == max(r * 2 * td.split_cap(r, 2) for r in range(1, 101)) == 1024
    # 16, 32 or 64 rows fill 1024 records; 100 rows at cap 4 take 800
    assert td.DecodeWorkspace(100, 14, 2, 64, "cpu", max_splits=32).records == 100 * 2 * 32


@pytest.mark.parametrize(
    "case",
    ["interpreted_float32_cases", "interpreted_long_row", "interpreted_errors",
     "interpreted_split_caps"],
)  # fmt: skip
def test_interpreted(case):
    run_interpreted(__file__, case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda(dtype, monkeypatch):
    lens = [1, 5, 16, 300, 0, 2000, 9000]
    s = _setup(lens, heads=9, kv_heads=3, d=64, dtype=dtype, device="cuda")
    before = s["cache"].clone()
    want, want_cache = _reference(s, before)
    got = _run(s)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert torch.equal(s["cache"], want_cache), "cache write differs from the torch rotation"
    for r in range(len(lens)):
        s["cache"].copy_(before)
        assert torch.equal(_run(s, rows=slice(r, r + 1))[0], got[r]), f"row {r}"
    # capped splits (large batches) agree with the reference too
    for splits in (1, 4):
        s["cache"].copy_(before)
        torch.testing.assert_close(_run(s, splits=splits).double(), want, rtol=tol, atol=tol)
    # programmatic dependent launch (H100/H200) changes when programs start, not results
    monkeypatch.setenv("VLLM_TRITON_PDL", "0")
    s["cache"].copy_(before)
    assert torch.equal(_run(s), got), "VLLM_TRITON_PDL=0 changed the result"
