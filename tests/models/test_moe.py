"""The mixture-of-experts layer on CPU float32: routing, the plain torch path against a
float64 reference, and the graph-capturable dense path exactly equal to the plain one."""

import pytest
import torch

from vllm.model_executor.layers.fused_moe import FusedMoE, route_topk

E, TOP_K, H, INTER, T = 8, 2, 32, 16, 40


def _moe(renormalize: bool) -> FusedMoE:
    gen = torch.Generator().manual_seed(0)
    moe = FusedMoE(E, TOP_K, H, INTER, renormalize)
    with torch.no_grad():
        moe.w13_weight.copy_(0.3 * torch.randn(moe.w13_weight.shape, generator=gen))
        moe.w2_weight.copy_(0.3 * torch.randn(moe.w2_weight.shape, generator=gen))
    return moe


def _inputs():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, H, generator=gen)  # [T, H]
    logits = 2.0 * torch.randn(T, E, generator=gen)  # [T, E]
    return x, logits


def test_route_topk_picks_largest_and_renormalises():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 3.5]])
    w, ids = route_topk(logits, 2, True, torch.float32)
    assert ids.tolist() == [[1, 2], [3, 0]]
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    probs = torch.softmax(logits, -1)
    w_raw, _ = route_topk(logits, 2, False, torch.float32)
    torch.testing.assert_close(w_raw, probs.gather(1, ids))


@pytest.mark.parametrize("renormalize", [True, False])
def test_native_matches_float64_reference(renormalize):
    """Uneven routing (checked), every token's two experts summed with their weights."""
    moe = _moe(renormalize)
    x, logits = _inputs()
    w, ids = route_topk(logits, TOP_K, renormalize, torch.float64)
    counts = torch.bincount(ids.flatten(), minlength=E)
    assert counts.min() < counts.max() and (counts > 0).sum() > TOP_K, counts
    w13, w2 = moe.w13_weight.double(), moe.w2_weight.double()
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(TOP_K):
            e = int(ids[t, j])
            gate, up = (w13[e] @ x[t].double()).chunk(2)
            ref[t] += w[t, j] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    out = moe.forward_native(x, logits)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_dense_path_equals_native_exactly():
    moe = _moe(True)
    x, logits = _inputs()
    assert torch.equal(moe.forward_dense(x, logits), moe.forward_native(x, logits))


def test_top_k_out_of_range_is_refused():
    with pytest.raises(ValueError, match="top_k=9 must be in"):
        FusedMoE(8, 9, H, INTER, True)
