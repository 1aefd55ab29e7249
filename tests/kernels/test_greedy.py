"""Greedy sampling's Triton kernels (vllm/kernels/greedy.py).

Reference: ``torch.argmax`` (exact: the first maximal index) and ``torch.log_softmax`` at
that token (float32 rounding), and ``Sampler.sample_on_device``'s torch path (the packed
rows). CPU: under ``TRITON_INTERPRET=1`` (tests.utils.run_interpreted). GPU (``gpu``
marker): the compiled kernels and the sampler's dispatch (CUDA, all greedy, no logprobs,
the env switch).
"""

import importlib.util

import pytest
import torch

from tests.utils import run_interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -r requirements-test.txt)",
)

# vocab sizes: one partial chunk, several chunks with a partial last one (SmolLM2's 49152
# is 12 full chunks of 4096), and the Llama-3.1 vocabulary
VOCABS = (1000, 9000, 49152, 128256)
LP_ATOL = 5e-5  # logprob tolerance (see _cases)


def _logits(rows: int, vocab: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(vocab + rows)
    x = torch.randn(rows, vocab, generator=gen) * 4  # [rows, vocab]
    x[0, vocab // 3] = 50.0  # a clear winner in a middle chunk
    if rows > 1:  # ties: the max at two indexes of different chunks, the first wins
        x[1, vocab - 1] = x[1, 17] = 60.0
    if rows > 2:
        x[2, : vocab // 2] = -float("inf")  # masked tokens (min_tokens / penalties)
    return x.to(device)


def _cases(device: str) -> None:
    from vllm.kernels import greedy

    for vocab in VOCABS:
        for rows in (1, 3, 8):
            x = _logits(rows, vocab, device)
            ids, packed = greedy.greedy_pack(x)
            want = x.argmax(dim=-1)
            ctx = f"vocab={vocab} rows={rows}"
            assert ids.dtype == torch.long and packed.dtype == torch.float64, ctx
            assert torch.equal(ids, want), (ctx, ids.tolist(), want.tolist())
            lp = torch.log_softmax(x, dim=-1).gather(1, want[:, None])[:, 0]  # [rows]
            assert torch.equal(packed[:, 0], want.double()), ctx
            # float32 sums over up to 128k logits: rounding alone reaches ~2e-5 (sqrt(n) ulp)
            torch.testing.assert_close(packed[:, 1], lp.double(), rtol=1e-5, atol=LP_ATOL)
            assert torch.all(packed[:, 2] == 1.0), ctx
            if rows > 1:
                assert ids[1].item() == 17, ctx  # the first of two equal maxima
            # 16-bit logits, as the lm_head writes them in a decode-loop graph: the ids of
            # their float32 copy exactly (bf16 rounding makes many more ties), the logprob
            # to float32 rounding
            for dt in (torch.bfloat16, torch.float16):
                wide = x.to(dt).float()  # [rows, vocab]
                ids16, packed16 = greedy.greedy_pack(x.to(dt))
                want16 = wide.argmax(dim=-1)
                assert torch.equal(ids16, want16), (ctx, dt, ids16.tolist(), want16.tolist())
                lp16 = torch.log_softmax(wide, dim=-1).gather(1, want16[:, None])[:, 0]
                torch.testing.assert_close(packed16[:, 1], lp16.double(), rtol=1e-5, atol=LP_ATOL)
                torch.testing.assert_close(packed16, greedy.greedy_pack(wide)[1], rtol=1e-5,
                                           atol=LP_ATOL)  # fmt: skip
    # a row of only -inf: token 0 and a NaN logprob, as torch.argmax / log_softmax give
    ids, packed = greedy.greedy_pack(torch.full((1, 5000), -float("inf"), device=device))
    assert ids.item() == 0 and torch.isnan(packed[0, 1])
    ids, packed = greedy.greedy_pack(torch.empty(0, 100, device=device))
    assert ids.shape == (0,) and packed.shape == (0, 3)
    ids, packed = greedy.greedy_pack(torch.full((1, 5000), -float("inf"), device=device).bfloat16())
    assert ids.item() == 0 and torch.isnan(packed[0, 1])
    for dt in (torch.float64, torch.int32):
        with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
            greedy.greedy_pack(torch.zeros(2, 10, dtype=dt, device=device))
    # the checks can fail: a wrong logprob (a missing chunk term) is caught
    x = (torch.randn(1, 9000, generator=torch.Generator().manual_seed(1)) * 4).to(device)
    bad = torch.log_softmax(x[:, :8192], dim=-1).amax(dim=-1).double()
    _, packed = greedy.greedy_pack(x)
    assert not torch.allclose(packed[:, 1], bad, rtol=1e-5, atol=LP_ATOL)


def _check_interpreted() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    from vllm.kernels import greedy

    assert isinstance(greedy._chunk_kernel, InterpretedFunction), "not interpreted"
    _cases("cpu")


def test_interpreted():
    run_interpreted(__file__, "_check_interpreted")


def test_cpu_sampler_keeps_torch(monkeypatch):
    """On CPU the sampler keeps its torch path (no Triton dispatch)."""
    from vllm.kernels.dispatch import get_triton_greedy

    assert get_triton_greedy(torch.zeros(1, 10)) is None


@pytest.mark.gpu
def test_cuda_kernels_and_sampler(monkeypatch):
    """Compiled kernels, and ``Sampler.sample_on_device`` on an all-greedy batch without
    logprobs: the Triton path's packed rows equal the torch path's ids exactly and its
    logprobs to float32 rounding; with logprobs asked, or the switch off, torch runs."""
    from vllm.kernels import greedy
    from vllm.kernels.dispatch import get_triton_greedy
    from vllm.model_executor.layers.sampler import Sampler
    from vllm.model_executor.sampling_metadata import SamplingMetadata

    _cases("cuda")
    x = _logits(4, 49152, "cuda")
    assert get_triton_greedy(x) is greedy
    sm = SamplingMetadata(
        groups=[], selected_token_indices=torch.arange(4, device="cuda"),
        sample_row_ids=torch.arange(4, device="cuda"), all_greedy=True,
    )  # fmt: skip
    calls = []
    orig = greedy.greedy_pack
    monkeypatch.setattr(greedy, "greedy_pack", lambda t: calls.append(1) or orig(t))
    ids, packed, k = Sampler.sample_on_device(x, sm)
    assert calls and k == 0
    # bf16 logits (a decode-loop graph's) go to the kernel as they are: the ids of their
    # float32 copy; with the switch off they are widened for the torch path
    xb = x.bfloat16()
    ids_b, packed_b, _ = Sampler.sample_on_device(xb, sm)
    assert len(calls) == 2
    ids_w, packed_w, _ = Sampler.sample_on_device(xb.float(), sm)  # the kernel on float32
    assert len(calls) == 3
    assert torch.equal(ids_b, ids_w)
    torch.testing.assert_close(packed_b, packed_w, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("VLLM_USE_TRITON_GREEDY", "0")
    ids_bt, packed_bt, _ = Sampler.sample_on_device(xb, sm)
    assert len(calls) == 3  # the torch path: widened first, so float32 logprobs
    assert torch.equal(ids_bt, ids_b)
    torch.testing.assert_close(packed_bt, packed_w, rtol=1e-5, atol=1e-5)
    del calls[1:]
    ids_t, packed_t, k_t = Sampler.sample_on_device(x, sm)
    assert len(calls) == 1 and k_t == 0
    assert torch.equal(ids, ids_t) and torch.equal(packed[:, 0], packed_t[:, 0])
    torch.testing.assert_close(packed, packed_t, rtol=1e-5, atol=1e-5)
