"""Each tensor-parallel layer on 2 gloo ranks (CPU, float32) equals the unsharded layer;
the ranks' graph-plan check raises when they disagree.

Column-parallel layers (merged gate/up, QKV with KV heads split or replicated) are checked
shard by shard: rank r's output is the columns of the full output it owns. Outputs are
compared with a 1e-5 tolerance, not exactly: a CPU GEMM's blocking (so its rounding)
depends on the matrix width, so a narrower shard's columns can differ in the last bit, and
layers that all-reduce (row-parallel, MoE experts) also sum partial products in another
order. The vocab-parallel embedding adds one non-zero row to zeros, so it is compared
exactly, and so are the loaded shards. Weights go through the layers' own
``weight_loader`` from full checkpoint tensors and from lazy safetensors slices.
"""

import multiprocessing
import os
import traceback

import pytest
import torch

from vllm.distributed.parallel_state import get_free_port

TP = 2


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _full(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)  # float32, the same on every rank


def _check_linear_layers(rank: int, lazy_file: str) -> None:
    from safetensors import safe_open

    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    x = _full((5, 16), 1)  # [T, hidden]
    # column-parallel: this rank's 12 of 24 output rows
    w = _full((24, 16), 2)
    col = ColumnParallelLinear(16, 24, bias=False)
    col.weight.weight_loader(col.weight, w)
    _close(col(x), (x @ w.T)[:, rank * 12 : (rank + 1) * 12])
    assert torch.equal(col.weight, w[rank * 12 : (rank + 1) * 12])
    # row-parallel with bias: partial sums all-reduced, bias added once
    w, b = _full((8, 24), 3), _full((8,), 4)
    row = RowParallelLinear(24, 8, bias=True)
    row.weight.weight_loader(row.weight, w)
    row.bias.weight_loader(row.bias, b)
    xr = _full((5, 24), 5)[:, rank * 12 : (rank + 1) * 12]  # this rank's input columns
    _close(row(xr), _full((5, 24), 5) @ w.T + b)
    # merged gate/up: [gate_r; up_r], from separate shards and from the fused tensor
    gate, up = _full((32, 16), 6), _full((32, 16), 7)
    ref = torch.cat([(x @ gate.T)[:, rank * 16 : (rank + 1) * 16],
                     (x @ up.T)[:, rank * 16 : (rank + 1) * 16]], dim=1)  # fmt: skip
    for shards in ([(gate, 0), (up, 1)], [(torch.cat([gate, up]), None)]):
        merged = MergedColumnParallelLinear(16, [32, 32])
        for t, sid in shards:
            merged.weight.weight_loader(merged.weight, t, sid)
        _close(merged(x), ref)
    # QKV, head_dim 4: 4 KV heads split 2 per rank; 1 KV head replicated on both ranks
    for kv_heads in (4, 1):
        q, k, v = _full((32, 16), 8), _full((4 * kv_heads, 16), 9), _full((4 * kv_heads, 16), 10)
        qkv = QKVParallelLinear(16, 4, 8, kv_heads, bias=False)
        assert (qkv.num_heads, qkv.num_kv_heads) == (4, max(1, kv_heads // TP))
        kv_rows = slice(rank * 8, rank * 8 + 8) if kv_heads == 4 else slice(0, 4)
        ref = torch.cat([(x @ q.T)[:, rank * 16 : rank * 16 + 16],
                         (x @ k.T)[:, kv_rows], (x @ v.T)[:, kv_rows]], dim=1)  # fmt: skip
        for shards in ([(q, "q"), (k, "k"), (v, "v")], [(torch.cat([q, k, v]), None)]):
            qkv.weight.data.zero_()
            for t, sid in shards:
                qkv.weight.weight_loader(qkv.weight, t, sid)
            _close(qkv(x), ref)
    # lazy safetensors slices: a rank reads only its rows / columns
    with safe_open(lazy_file, framework="pt", device="cpu") as f:
        col = ColumnParallelLinear(16, 24)
        col.weight.weight_loader(col.weight, f.get_slice("col"))
        row = RowParallelLinear(24, 8)
        row.weight.weight_loader(row.weight, f.get_slice("row"))
        full_col, full_row = f.get_tensor("col"), f.get_tensor("row")
    assert torch.equal(col.weight, full_col[rank * 12 : (rank + 1) * 12])
    assert torch.equal(row.weight, full_row[:, rank * 12 : (rank + 1) * 12])


def _check_vocab_and_moe(rank: int) -> None:
    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

    vocab, hidden = 37, 8  # odd vocabulary: shard 19, the last row of rank 1 is padding
    table = _full((vocab, hidden), 11)
    emb = VocabParallelEmbedding(vocab, hidden)
    emb.weight.weight_loader(emb.weight, table)
    assert emb.weight.shape == (19, hidden)
    ids = torch.tensor([0, 18, 19, 36, 5, 20])
    assert torch.equal(emb(ids), table[ids])
    head = ParallelLMHead(vocab, hidden)
    head.weight.weight_loader(head.weight, table)
    h = _full((3, hidden), 12)
    logits = head.compute_logits(h)
    if rank == 0:  # gathered on TP rank 0, padding column dropped
        assert logits.shape == (3, vocab) and logits.dtype == torch.float32
        _close(logits, h @ table.T)
    else:
        assert logits is None
    # MoE: every expert's intermediate dim split, outputs all-reduced
    experts, inter = 4, 8
    moe = FusedMoE(experts, 2, hidden, inter, renormalize=True)
    assert moe.w13_weight.shape == (experts, 2 * inter // TP, hidden)
    ref = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(ref)
    ref.__dict__.update(num_experts=experts, top_k=2, renormalize=True, act_fn=moe.act_fn)
    w13, w2 = _full((experts, 2 * inter, hidden), 13), _full((experts, hidden, inter), 14)
    ref.w13_weight, ref.w2_weight = torch.nn.Parameter(w13), torch.nn.Parameter(w2)
    for e in range(experts):
        moe.load_expert("w13_weight", w13[e, :inter], e, 0)
        moe.load_expert("w13_weight", w13[e, inter:], e, 1)
        moe.load_expert("w2_weight", w2[e], e, None)
    x, router = _full((6, hidden), 15), _full((6, experts), 16)
    _close(moe(x, router), FusedMoE.forward_native(ref, x, router))


def _check_plan_agreement(rank: int) -> None:
    """Ranks that plan the same step pass; a rank planning eager where the other replays
    graph 8 makes both raise (instead of deadlocking in their next all-reduce)."""
    from vllm.distributed.tp_ops import assert_tp_plan_agreement

    assert_tp_plan_agreement((0, 1, 8, 8))
    with pytest.raises(RuntimeError) as e:
        assert_tp_plan_agreement((0, 1, 8 if rank == 0 else -1, 8))
    assert "rank 0: (0, 1, 8, 8), rank 1: (0, 1, -1, 8)" in str(e.value)
    assert "pipeline stage 0 disagree" in str(e.value)


def _rank_main(rank: int, init_method: str, lazy_file: str, errors) -> None:
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        init_distributed_environment,
    )

    try:
        torch.set_num_threads(1)
        init_distributed_environment(
            rank, TP, init_method, torch.device("cpu"), timeout_s=60, tensor_parallel_size=TP
        )
        with torch.no_grad():
            _check_linear_layers(rank, lazy_file)
            _check_vocab_and_moe(rank)
        _check_plan_agreement(rank)
        destroy_distributed_environment()
    except BaseException:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")


@pytest.mark.forked
def test_sharded_layers_equal_unsharded(tmp_path):
    """Both ranks run every layer check (and the plan check) and report any failure."""
    from safetensors.torch import save_file

    lazy_file = os.path.join(tmp_path, "w.safetensors")
    save_file({"col": _full((24, 16), 20), "row": _full((8, 24), 21)}, lazy_file)
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.Queue()
    init = f"tcp://127.0.0.1:{get_free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, init, lazy_file, errors)) for r in range(TP)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    found = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert not found, "\n".join(found)
    assert not alive, "a rank did not finish within 120 s"
    assert [p.exitcode for p in procs] == [0, 0]
