"""Rejection sampler, n-gram lookup and proposal capping (unit and statistical tests)."""

import pytest
import torch

from vllm.spec_decode.ngram_proposer import ngram_lookup, proposal_len
from vllm.spec_decode.rejection_sampler import rejection_sample


def _greedy(draft, lens, argmax):
    b = len(draft)
    out, acc = rejection_sample(
        torch.tensor(draft), None, torch.tensor(lens), torch.tensor(argmax), None,
        torch.ones(b, dtype=torch.bool), [None] * b,
    )  # fmt: skip
    return out.tolist(), acc.tolist()


def test_greedy_accept_prefix_then_target():
    out, acc = _greedy([[1, 2, 3]], [3], [[1, 2, 9, 4]])
    assert acc == [2] and out == [[1, 2, 9, -1]]


def test_greedy_all_accepted_gets_bonus():
    out, acc = _greedy([[1, 2, 3]], [3], [[1, 2, 3, 7]])
    assert acc == [3] and out == [[1, 2, 3, 7]]


def test_greedy_first_rejected_and_short_proposals():
    out, acc = _greedy(
        [[5, 2, 3], [1, 2, 0], [4, 0, 0]], [3, 2, 0], [[1] * 4, [1, 2, 8, 8], [6] * 4]
    )
    assert acc == [0, 2, 0]
    assert out == [[1, -1, -1, -1], [1, 2, 8, -1], [6, -1, -1, -1]]


def _sampled(p, q, draft, lens, gens=None, greedy=None):
    b, k = draft.shape
    return rejection_sample(
        draft, q, lens, p.argmax(dim=-1), p,
        torch.zeros(b, dtype=torch.bool) if greedy is None else greedy,
        gens or [None] * b,
    )  # fmt: skip


@pytest.mark.parametrize("deterministic_q", [False, True])
def test_sampled_output_distribution_equals_target(deterministic_q):
    """Emitted tokens are distributed as the target p: position 0 over all rows and
    position 1 over rows that accepted position 0. N = 40000 rows; tolerance 0.015
    (position 0, over 6 standard deviations) and 0.02 (position 1, >= 5000 rows)."""
    torch.manual_seed(0)
    n, k, v = 40000, 2, 5
    p_row = torch.tensor([0.1, 0.4, 0.2, 0.25, 0.05])
    q_row = torch.tensor([0.3, 0.1, 0.3, 0.2, 0.1])
    p = p_row.expand(n, k + 1, v).contiguous()
    q = q_row.expand(n, k, v).contiguous()
    if deterministic_q:
        draft = torch.full((n, k), 2, dtype=torch.long)  # n-gram style, q one-hot
        q = None
    else:
        draft = torch.multinomial(q_row, n * k, replacement=True).view(n, k)
    out, acc = _sampled(p, q, draft, torch.full((n,), k))
    first = torch.bincount(out[:, 0], minlength=v).float() / n
    assert torch.allclose(first, p_row, atol=0.015), first
    second = out[:, 1][acc >= 1]
    freq = torch.bincount(second, minlength=v).float() / len(second)
    assert len(second) > 5000 and torch.allclose(freq, p_row, atol=0.02), freq
    # acceptance rate of a sampled draft: sum min(p, q) = 0.1+0.1+0.2+0.2+0.05 = 0.65
    if not deterministic_q:
        rate = (acc.float().clamp(max=1)).mean().item()
        assert abs(rate - 0.65) < 0.015, rate


def test_seeded_rows_reproducible_and_independent():
    v, k = 7, 3
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(2, k + 1, v), -1)
    q = torch.softmax(torch.randn(2, k, v), -1)
    draft = torch.tensor([[1, 2, 3], [4, 5, 6]])
    lens = torch.tensor([3, 3])
    res = []
    for other in range(3):
        torch.manual_seed(100 + other)  # the unseeded row draws differently each time
        g = torch.Generator().manual_seed(7)
        out, _ = _sampled(p, q, draft, lens, gens=[g, None])
        res.append(out[0].tolist())
    assert res[0] == res[1] == res[2]


def test_mixed_greedy_and_sampled_rows():
    v, k = 6, 2
    p = torch.softmax(torch.randn(2, k + 1, v), -1)
    draft = p.argmax(-1)[:, :k].clone()
    out, acc = _sampled(p, None, draft, torch.tensor([2, 2]), greedy=torch.tensor([True, False]))
    assert acc[0] == 2 and out[0].tolist() == p.argmax(-1)[0].tolist()


def test_ngram_lookup_longest_latest():
    toks = [1, 2, 3, 9, 1, 2, 3, 4, 5, 0, 2, 3]
    assert ngram_lookup(toks, 3, 1, 3) == [4, 5, 0]  # [2, 3] latest at index 5
    assert ngram_lookup([1, 2, 3, 1, 2, 3], 4, 2, 5) == [1, 2, 3]  # n=3 match at 0
    assert ngram_lookup([7, 8, 9], 3, 1, 4) == []
    assert ngram_lookup([4, 5, 4], 2, 1, 2) == [5, 4]
    assert ngram_lookup([4, 5, 4], 2, 2, 2) == []
    assert ngram_lookup([4, 5, 4], 2, 1, 0) == []


@pytest.mark.parametrize("k", [1, 4])
def test_proposal_len_capping(k):
    limit = 64
    # a step with L proposals emits L + 1 tokens and writes KV up to position n - 1 + L
    assert proposal_len(limit - k - 1, k, limit, limit) == k
    assert proposal_len(limit - k, k, limit, limit) == k - 1
    assert proposal_len(limit - 1, k, limit, limit) == 0
    assert proposal_len(limit, k, limit, limit) == 0
    for n in range(1, limit + 1):
        L = proposal_len(n, k, limit, limit)
        assert 0 <= L <= k and n + L + 1 <= max(limit, n + 1)
    # the draft's own limit caps too
    assert proposal_len(10, k, limit, 12) == min(k, 1)
