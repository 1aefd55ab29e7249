"""The packed token bitmask: unpacking and applying it agree with a per-token reference,
on the CPU path (xgrammar's kernel) and the torch path used on other devices."""

import pytest
import torch

from vllm.model_executor.guided_decoding import bitmask as bm

VOCAB = 70  # not a multiple of 32: the last word is partly padding


def _packed(allowed: list[set[int]]) -> torch.Tensor:
    words = torch.zeros(len(allowed), bm.words_per_row(VOCAB), dtype=torch.int64)
    for r, toks in enumerate(allowed):
        for t in toks:
            words[r, t // 32] |= 1 << (t % 32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # as int32 bit patterns
    return words.to(torch.int32)


ALLOWED = [{0, 5, 31, 32, 63, 69}, {1}, set(range(VOCAB)), {33, 34, 40}]


def test_unpack_matches_reference():
    got = bm.unpack_bitmask(_packed(ALLOWED), VOCAB)
    want = torch.tensor([[t in a for t in range(VOCAB)] for a in ALLOWED])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"too narrow for a vocabulary of 70 tokens"):
        bm.unpack_bitmask(_packed(ALLOWED)[:, :2], VOCAB)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 3]])
@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_apply_sets_forbidden_tokens_to_minus_inf(rows, path, monkeypatch):
    logits = torch.randn(4, VOCAB)
    mask = _packed([ALLOWED[r] for r in rows])
    if path == "torch":  # the non-CPU path, run on CPU tensors
        monkeypatch.setattr(bm, "_on_cpu", lambda t: False)
    out = bm.apply_token_bitmask(logits.clone(), torch.tensor(rows), mask)
    for r in range(4):
        for t in range(VOCAB):
            forbidden = r in rows and t not in ALLOWED[r]
            assert out[r, t].item() == (float("-inf") if forbidden else logits[r, t].item())
