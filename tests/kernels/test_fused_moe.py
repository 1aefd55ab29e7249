"""The Triton MoE expert kernel (vllm/kernels/fused_moe.py) against the plain torch experts
(FusedMoE.forward_native). CPU: under ``TRITON_INTERPRET=1`` (tests.utils.run_interpreted),
float32. GPU (``gpu`` marker): compiled, bfloat16, and a CUDA graph replay equal to eager."""

import importlib.util

import pytest
import torch

from tests.utils import run_interpreted, skip_old_interpreter

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

E, TOP_K, H, INTER = 8, 2, 64, 48  # INTER: 2I = 96 is not a multiple of the 64-wide blocks


def _moe(device, dtype):
    from vllm.model_executor.layers.fused_moe import FusedMoE

    gen = torch.Generator().manual_seed(0)
    moe = FusedMoE(E, TOP_K, H, INTER, True)
    with torch.no_grad():
        moe.w13_weight.copy_(0.2 * torch.randn(moe.w13_weight.shape, generator=gen))
        moe.w2_weight.copy_(0.2 * torch.randn(moe.w2_weight.shape, generator=gen))
    return moe.to(device=device, dtype=dtype)


def _inputs(num_tokens, device, dtype):
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, H, generator=gen).to(device, dtype)  # [T, H]
    logits = (2.0 * torch.randn(num_tokens, E, generator=gen)).to(device, dtype)  # [T, E]
    return x, logits


def _cases(device="cpu", dtype=torch.float32, tol=1e-4):
    from vllm.kernels import fused_moe
    from vllm.model_executor.layers.fused_moe import route_topk

    moe = _moe(device, dtype)
    for num_tokens in (1, 3, 40):
        x, logits = _inputs(num_tokens, device, dtype)
        weights, ids = route_topk(logits, TOP_K, True, dtype)
        got = fused_moe.fused_experts(x, moe.w13_weight, moe.w2_weight, weights, ids)
        want = moe.forward_native(x, logits)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # every block of one expert, the rest idle: padding and dead blocks store nothing
    ids = torch.full((5, TOP_K), 3, dtype=torch.long, device=device)
    ids[:, 1] = 6
    sorted_pairs, block_expert = fused_moe.align_block_size(ids, E)
    assert sorted_pairs.tolist()[:5] == [0, 2, 4, 6, 8]
    assert block_expert.tolist()[:3] == [3, 6, E]


def test_fused_experts_interpreted():
    skip_old_interpreter()  # a CUDA host's Triton 3.6 runs the compiled case below
    run_interpreted(__file__, "_cases")


@pytest.mark.gpu
def test_fused_experts_gpu_and_graph():
    _cases("cuda", torch.bfloat16, tol=3e-2)
    from vllm.kernels import fused_moe
    from vllm.model_executor.layers.fused_moe import route_topk

    moe = _moe("cuda", torch.bfloat16)
    x, logits = _inputs(64, "cuda", torch.bfloat16)

    def step():
        weights, ids = route_topk(logits, TOP_K, True, x.dtype)
        return fused_moe.fused_experts(x, moe.w13_weight, moe.w2_weight, weights, ids)

    eager = step()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm-up (Triton compiles outside the capture)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
