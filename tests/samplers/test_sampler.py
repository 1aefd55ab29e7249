"""Sampler unit tests on hand-made logits (no engine): penalties with hand-computed
values, filters, the sampled distribution, seeded independence, min_tokens, logprobs."""

import math

import pytest
import torch

from vllm.model_executor.layers.sampler import Sampler, apply_penalties, filter_logits
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata


def _metadata(groups, vocab, generators=None, logprobs_mode="raw_logprobs"):
    """groups: list of (params, [(seq_id, prompt_ids, output_ids), ...]) decode rows."""
    mds, qlens = [], []
    for i, (params, seqs) in enumerate(groups):
        data = {sid: SequenceData(list(p), list(o)) for sid, p, o in seqs}
        mds.append(SequenceGroupMetadata(str(i), False, data, params, {s: [] for s in data}))
        qlens += [1] * len(seqs)
    gens = {} if generators is None else generators
    return SamplingMetadata.build(
        mds, qlens, vocab, torch.device("cpu"), gens, logprobs_mode=logprobs_mode
    )


def test_apply_penalties_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0], [2.0, -1.0, 0.5, 3.0, -2.0]])
    V = 5  # padding id
    prompt = torch.tensor([[0, V], [4, 4]])
    output = torch.tensor([[1, 3, 3], [V, V, V]])
    apply_penalties(
        logits,
        prompt,
        output,
        presence=torch.tensor([0.25, 0.0]),
        frequency=torch.tensor([0.5, 0.0]),
        repetition=torch.tensor([2.0, 1.0]),
    )
    # Row 0: seen {0 (prompt), 1, 3}; repetition 2: 2/2=1, -1*2=-2, 3/2=1.5;
    # frequency 0.5 x count (1: once, 3: twice); presence 0.25 for 1 and 3.
    expected0 = [1.0, -2.0 - 0.5 - 0.25, 0.5, 1.5 - 1.0 - 0.25, -2.0]
    assert logits[0].tolist() == pytest.approx(expected0, abs=1e-6)
    assert logits[1].tolist() == pytest.approx([2.0, -1.0, 0.5, 3.0, -2.0], abs=1e-6)


def test_penalties_through_metadata_change_greedy_choice():
    logits = torch.tensor([[0.0, 3.0, 2.9, 0.0]])
    sampler = Sampler()
    plain = _metadata([(SamplingParams(temperature=0), [(0, [0], [1])])], 4)
    assert sampler(logits, plain).outputs[0].samples[0].output_token == 1
    pen = SamplingParams(temperature=0, presence_penalty=0.5)
    sm = _metadata([(pen, [(0, [0], [1])])], 4)
    out = sampler(logits, sm).outputs[0].samples[0]
    assert out.output_token == 2
    # the default (raw) logprobs are the model's: token 2 is second to token 1
    assert out.logprobs[2].logprob == pytest.approx(logits.log_softmax(-1)[0, 2].item())
    assert out.logprobs[2].rank == 2
    # processed logprobs come from the penalized logits: 3.0 - 0.5 = 2.5 for token 1
    sm = _metadata([(pen, [(0, [0], [1])])], 4, logprobs_mode="processed_logprobs")
    out = sampler(logits, sm).outputs[0].samples[0]
    expect = torch.log_softmax(torch.tensor([0.0, 2.5, 2.9, 0.0]), -1)[2].item()
    assert out.logprobs[2].logprob == pytest.approx(expect, abs=1e-6)
    assert out.logprobs[2].rank == 1


def test_filters_keep_expected_support():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    one = torch.ones(1)

    def f(top_k=4.0, top_p=1.0, min_p=0.0):
        return filter_logits(logits, one, one * top_k, one * top_p, one * min_p).softmax(-1)[0]

    assert f(top_k=2).tolist() == pytest.approx([0.625, 0.375, 0, 0], abs=1e-6)
    # top_p: a token is kept while the mass before it is below p.
    assert f(top_p=0.8).tolist() == pytest.approx([0.625, 0.375, 0, 0], abs=1e-6)
    assert (f(top_p=0.81) > 0).tolist() == [True, True, True, False]
    assert (f(top_p=0.01) > 0).tolist() == [True, False, False, False]
    # min_p 0.5: keep p >= 0.25
    assert f(min_p=0.5).tolist() == pytest.approx([0.625, 0.375, 0, 0], abs=1e-6)
    assert f().tolist() == pytest.approx(probs[0].tolist(), abs=1e-6)


def test_temperature_sampling_follows_softmax():
    """20k draws from one row of fixed logits at temperature 0.7 (global generator with a
    fixed seed). Tolerance: chi-square with 5 degrees of freedom below 20.5 (p = 0.001)
    and max |freq - p| below 0.01 (about 3 standard deviations at N = 20000)."""
    torch.manual_seed(1234)
    logits_row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, 0.2])
    n = 20000
    params = SamplingParams(temperature=0.7, n=n)
    sm = _metadata([(params, [(i, [0], []) for i in range(n)])], 6)
    out = Sampler()(logits_row.expand(n, 6).contiguous(), sm)
    counts = torch.bincount(out.sampled_token_ids, minlength=6).double()
    expected = torch.softmax(logits_row.double() / 0.7, -1) * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.5, (chi2, counts.tolist(), expected.tolist())
    assert (counts / n - expected / n).abs().max().item() < 0.01


def test_seeded_row_draws_follow_softmax():
    """A seeded sequence drawn 3000 times in a row from its own generator; max |freq - p|
    below 0.035 (about 3 standard deviations at N = 3000)."""
    logits = torch.tensor([[0.0, 1.0, 0.3, -1.0]])
    params = SamplingParams(temperature=1.0, seed=7)
    gens: dict = {}
    sampler = Sampler()
    counts = [0] * 4
    for _ in range(3000):
        sm = _metadata([(params, [(0, [0], [])])], 4, gens)
        counts[sampler(logits, sm).outputs[0].samples[0].output_token] += 1
    p = torch.softmax(logits[0], -1).tolist()
    assert max(abs(c / 3000 - q) for c, q in zip(counts, p)) < 0.035


def test_top_k_0_and_minus_1_both_disable():
    """Upstream's current "off" is 0, its older one -1: both are accepted and stored as -1
    (the sampler's "no top-k")."""
    assert SamplingParams(top_k=0).top_k == SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(top_k=5).top_k == 5


def test_top_k_1_equals_greedy():
    torch.manual_seed(0)
    logits = torch.randn(64, 300)
    seqs = [(i, [0], []) for i in range(64)]
    g = Sampler()(logits, _metadata([(SamplingParams(temperature=0), seqs)], 300))
    r = Sampler()(logits, _metadata([(SamplingParams(temperature=1.5, top_k=1), seqs)], 300))
    assert torch.equal(g.sampled_token_ids, r.sampled_token_ids)
    assert torch.equal(g.sampled_token_ids, logits.argmax(-1))


def test_seeded_tokens_do_not_depend_on_batch():
    """The seeded row (seq 100) gets the same tokens for 6 steps alone, after other random
    rows, and next to another seeded request; n=2 with one seed gives two streams."""
    torch.manual_seed(0)
    V = 50
    row = torch.randn(V)
    seeded = SamplingParams(temperature=1.0, seed=42)
    other = SamplingParams(temperature=0.9)
    other_seeded = SamplingParams(temperature=1.0, seed=3)

    def run(layout):
        gens: dict = {}
        toks = []
        for _ in range(6):
            groups, logits = [], []
            for kind in layout:
                if kind == "me":
                    groups.append((seeded, [(100, [0], [])]))
                elif kind == "rand":
                    groups.append((other, [(len(groups), [0], []), (len(groups) + 50, [0], [])]))
                else:
                    groups.append((other_seeded, [(len(groups) + 200, [0], [])]))
                logits += [row] * len(groups[-1][1])
            sm = _metadata(groups, V, gens)
            out = Sampler()(torch.stack(logits), sm)
            i = layout.index("me")
            toks.append(out.outputs[i].samples[0].output_token)
        return toks

    alone = run(["me"])
    assert run(["rand", "me"]) == alone
    assert run(["seeded", "rand", "me", "rand"]) == alone
    assert len(set(alone)) > 1
    # n=2 seeded: seq i uses seed + i, so the streams differ, and each reproduces.
    gens: dict = {}
    params = SamplingParams(temperature=1.0, seed=42, n=2)
    streams = [[], []]
    for _ in range(8):
        out = Sampler()(
            row.expand(2, V), _metadata([(params, [(0, [0], []), (1, [0], [])])], V, gens)
        )
        for j, s in enumerate(out.outputs[0].samples):
            streams[j].append(s.output_token)
    assert streams[0] != streams[1]
    assert streams[0][:6] == alone


def test_min_tokens_masks_stop_tokens():
    logits = torch.tensor([[0.0, 1.0, 5.0, 0.5]])
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3])
    p.all_stop_token_ids.add(2)  # EOS, as the engine adds it
    early = Sampler()(logits, _metadata([(p, [(0, [0], [1])])], 4)).outputs[0].samples[0]
    assert early.output_token == 1
    assert early.logprobs[1].rank == 2  # raw logprobs (the default): EOS is the model's first
    sm = _metadata([(p, [(0, [0], [1])])], 4, logprobs_mode="processed_logprobs")
    assert Sampler()(logits, sm).outputs[0].samples[0].logprobs[1].rank == 1
    late = Sampler()(logits, _metadata([(p, [(0, [0], [1, 1])])], 4)).outputs[0].samples[0]
    assert late.output_token == 2


def test_logprobs_and_ranks():
    torch.manual_seed(3)
    logits = torch.randn(3, 40)
    params = SamplingParams(temperature=0, logprobs=4)
    out = Sampler()(logits, _metadata([(params, [(i, [0], []) for i in range(3)])], 40))
    ref = torch.log_softmax(logits, -1)
    for i, s in enumerate(out.outputs[0].samples):
        top = ref[i].topk(4)
        assert list(s.logprobs) == top.indices.tolist()  # sampled (rank 1) first
        for rank, (v, t) in enumerate(zip(top.values.tolist(), top.indices.tolist()), 1):
            assert s.logprobs[t].rank == rank
            assert math.isclose(s.logprobs[t].logprob, v, abs_tol=1e-6)


def test_row_argmax_matches_torch_on_ties_nan_and_views():
    """The CPU argmax fast path (numpy) picks what torch.argmax picks: the first maximum
    of a row, a NaN counting as the maximum, also on a strided view and in float64."""
    from vllm.model_executor.layers.sampler import row_argmax

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 50, generator=g)
    x[1, 7] = x[1, 30] = 9.0  # a tie: the first wins
    x[2, 11] = float("nan")
    x[3] = 0.0  # all equal
    for t in (x, x[:, ::2], x.double(), x.t().contiguous().t()):
        got = row_argmax(t)
        assert got.dtype == torch.int64
        assert torch.equal(got, t.argmax(dim=-1)), (got, t.argmax(dim=-1))
    assert row_argmax(x).tolist()[1:4] == [7, 11, 0]
