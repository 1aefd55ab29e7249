"""Prefill over a cached context (prefix caching) on TORCH_SDPA and FLASHINFER: rows whose
first ``c`` tokens are already in the paged cache compute only the rest and must equal full
causal attention over the whole sequence. FLASHINFER runs on CPU with the fake wrappers of
tests/worker/fakes.py (same plan arguments, bottom-right causal mask as FlashInfer's paged
prefill), and on CUDA with FlashInfer itself (gpu)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs

H, H_KV, D, BS, NUM_BLOCKS = 4, 2, 64, 4, 12  # head_dim 64: a size FlashInfer has
# (sequence length, cached tokens, block table): a 2-block context, none, a 1-block one.
ROWS = [(11, 8, [5, 2, 9]), (6, 0, [0, 7]), (5, 4, [3, 4])]


def _reference(q, k, v):
    """Full causal attention of one sequence; q [n, H, D], k/v [n, H_KV, D]."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=D**-0.5, enable_gqa=True,
    )  # fmt: skip
    return out[0].transpose(0, 1)  # [n, H, D]


def _case(device, dtype, put):
    """Random q/k/v per row; the cached positions written with ``put(slot, k, v)``. Returns
    the step, the new tokens' q/k/v and the expected output of the new tokens."""
    g = torch.Generator().manual_seed(0)
    qs, ks, vs, want, slots = [], [], [], [], []
    for n, c, table in ROWS:
        q = torch.randn(n, H, D, generator=g).to(device, dtype)
        k = torch.randn(n, H_KV, D, generator=g).to(device, dtype)
        v = torch.randn(n, H_KV, D, generator=g).to(device, dtype)
        for p in range(c):
            put(table[p // BS] * BS + p % BS, k[p], v[p])
        want.append(_reference(q.float(), k.float(), v.float())[c:])
        qs.append(q[c:])
        ks.append(k[c:])
        vs.append(v[c:])
        slots.extend(table[p // BS] * BS + p % BS for p in range(c, n))
    step = StepInputs(
        ForwardMode.PREFILL, [n for n, _, _ in ROWS], [n - c for n, c, _ in ROWS],
        [t for _, _, t in ROWS], slots, len(ROWS),
    )  # fmt: skip
    flat = lambda xs: torch.cat(xs).reshape(sum(x.shape[0] for x in xs), -1)  # noqa: E731
    return step, flat(qs), flat(ks), flat(vs), torch.cat(want)


def _spec(device, dtype):
    return AttentionSpec(H, H_KV, D, BS, dtype, torch.device(device), small_decode_max_rows=0)


LAYER = SimpleNamespace(num_heads=H, num_kv_heads=H_KV, head_size=D, scale=D**-0.5)


def _run_sdpa(device, dtype):
    from vllm.attention.backends.torch_sdpa import TorchSDPABackend

    backend = TorchSDPABackend(_spec(device, dtype))
    cache = torch.zeros(2, NUM_BLOCKS + 1, BS, H_KV, D, device=device, dtype=dtype)

    def put(slot, k, v):
        cache[0].view(-1, H_KV, D)[slot] = k
        cache[1].view(-1, H_KV, D)[slot] = v

    step, q, k, v, want = _case(device, dtype, put)
    md = backend.build_metadata(step, NUM_BLOCKS * BS)
    assert md.context_lens == [8, 0, 4]
    out = md.impl.forward(LAYER, q, k, v, cache, md)
    return out.view(-1, H, D), want


def _run_flashinfer(device, dtype, fakes):
    from vllm.attention.backends.flashinfer.flashinfer import FlashInferBackend

    classes = (FakePrefillWrapper, FakeDecodeWrapper) if fakes else (None, None)
    backend = FlashInferBackend(_spec(device, dtype), *classes)
    cache = torch.zeros(NUM_BLOCKS + 1, 2, BS, H_KV, D, device=device, dtype=dtype)

    def put(slot, k, v):
        cache[slot // BS, 0, slot % BS] = k
        cache[slot // BS, 1, slot % BS] = v

    step, q, k, v, want = _case(device, dtype, put)
    md = backend.build_metadata(step, NUM_BLOCKS * BS)
    out = md.impl.forward(LAYER, q, k, v, cache, md)
    assert backend.prefill_runs == 1 and backend.graph_prefill_runs == 0
    return out.view(-1, H, D), want, md


def test_torch_sdpa_context_prefill_equals_full_causal_attention():
    out, want = _run_sdpa("cpu", torch.float32)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_flashinfer_plans_the_cached_context_fake_wrapper():
    """The paged prefill wrapper is planned with query lengths = new tokens and pages
    covering the whole sequence, so its bottom-right causal mask attends each new token to
    the cached context and to the new tokens before it."""
    out, want, md = _run_flashinfer("cpu", torch.float32, fakes=True)
    w = md.wrapper
    assert w.qo.tolist() == [0, 3, 9, 10]
    assert w.indptr.tolist() == [0, 3, 5, 7]
    assert w.indices.tolist() == [5, 2, 9, 0, 7, 3, 4]
    assert w.last.tolist() == [3, 2, 1]
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_context_prefill_on_cuda_bf16(backend):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if backend == "FLASHINFER":
        out, want, _ = _run_flashinfer("cuda", torch.bfloat16, fakes=False)
    else:
        out, want = _run_sdpa("cuda", torch.bfloat16)
    torch.testing.assert_close(out.float(), want.to(out.device), atol=2e-2, rtol=2e-2)
