"""The speculative step's host path: n-gram lookup against a brute-force reference, the host
greedy rule against the device rejection sampler, the flat <-> padded layout of the sampled
path, one device-to-host read per scored step, and logprobs equal to the run without
speculation."""

import random

import pytest
import torch

from vllm.spec_decode.interfaces import SpeculativeScores
from vllm.spec_decode.ngram_proposer import ngram_lookup
from vllm.spec_decode.rejection_sampler import (
    greedy_num_accepted,
    rejection_sample,
    sample_expanded,
)


def _lookup_reference(tokens, max_n, min_n, num):
    """Try every n from the longest down and every start from the latest back."""
    if num <= 0:
        return []
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        for start in range(size - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[size - n :]:
                return tokens[start + n : start + n + num]
    return []


def test_ngram_lookup_equals_brute_force():
    rng = random.Random(0)
    found = 0
    for _ in range(20000):
        vocab = rng.randint(1, 5)  # small vocabularies make many partial matches
        toks = [rng.randrange(vocab) for _ in range(rng.randint(0, 24))]
        max_n = rng.randint(1, 5)
        min_n = rng.randint(1, max_n)
        num = rng.randint(0, 5)
        want = _lookup_reference(toks, max_n, min_n, num)
        assert ngram_lookup(toks, max_n, min_n, num) == want, (toks, max_n, min_n, num)
        found += bool(want)
    assert found > 5000  # the cases exercise real matches
    # the longest n wins over a later shorter match; the latest of equal length wins
    assert ngram_lookup([1, 2, 3, 7, 9, 3, 8, 1, 2, 3], 3, 1, 2) == [7, 9]
    assert ngram_lookup([5, 1, 6, 5, 1, 7, 5, 1], 2, 1, 1) == [7]


def test_greedy_num_accepted_equals_device_rule():
    gen = torch.Generator().manual_seed(0)
    k, bsz = 4, 6
    for _ in range(50):
        lens = torch.randint(0, k + 1, (bsz,), generator=gen)
        draft = torch.randint(0, 3, (bsz, k), generator=gen)
        argmax = torch.randint(0, 3, (bsz, k + 1), generator=gen)
        out, acc = rejection_sample(
            draft, None, lens, argmax, None, torch.ones(bsz, dtype=torch.bool), [None] * bsz
        )
        props = [draft[b, : lens[b]].tolist() for b in range(bsz)]
        starts, flat = [0], []
        for b, p in enumerate(props):  # flat rows: L_b + 1 per sequence
            flat += argmax[b, : len(p) + 1].tolist()
            starts.append(starts[-1] + len(p) + 1)
        got = greedy_num_accepted(props, flat, starts)
        assert got == acc.tolist()
        for b in range(bsz):  # emitted = the argmax of the first acc + 1 rows
            assert flat[starts[b] : starts[b] + got[b] + 1] == out[b, : got[b] + 1].tolist()


def test_sample_expanded_equals_padded_rejection_sample():
    """The flat layout (rows of sequences with 4, 0 and 2 proposals) gives the same tokens as
    rejection_sample on the padded [B, k+1] layout with the same random state."""
    k, v = 4, 7
    props = [[1, 2, 3, 4], [], [5, 6]]
    lens = [len(p) for p in props]
    starts = [0, 5, 6, 9]
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(starts[-1], v, generator=gen) * 2, -1)  # [R, V]
    for p_rows in range(starts[-1]):  # make some proposals likely so runs get accepted
        probs[p_rows] = 0.5 * probs[p_rows] + 0.5 * torch.eye(v)[(p_rows % 6) + 1]
    argmax = probs.argmax(-1)
    greedy = [False, True, False]

    def seeded():
        return [torch.Generator().manual_seed(11), None, torch.Generator().manual_seed(12)]

    for trial in range(20):
        gens = seeded()
        row_gens = [gens[b] for b in range(3) for _ in range(lens[b] + 1)]
        sm = type("SM", (), {"generators": row_gens})()
        scores = SpeculativeScores(argmax, probs, torch.log(probs), starts, sm)
        torch.manual_seed(100 + trial)
        flat = sample_expanded(scores, props, None, greedy, k).tolist()
        index = torch.tensor(
            [[starts[b] + min(j, lens[b]) for j in range(k + 1)] for b in range(3)]
        )
        draft = torch.tensor([p + [0] * (k - len(p)) for p in props])
        torch.manual_seed(100 + trial)
        out, acc = rejection_sample(
            draft, None, torch.tensor(lens), argmax[index], probs[index],
            torch.tensor(greedy), seeded(),
        )  # fmt: skip
        want = [out[b, j].item() for b in range(3) for j in range(lens[b] + 1)]
        assert flat == want
        assert flat[5] == argmax[5].item()  # the greedy sequence without proposals


def _count_reads(monkeypatch, worker):
    """Wrap worker._score_and_accept; count device-to-host reads made inside it."""
    counts = {"reads": 0, "steps": 0, "inside": False}
    for name in ("tolist", "item", "__bool__", "cpu", "numpy"):
        orig = getattr(torch.Tensor, name)

        def wrapped(self, *a, _orig=orig, **kw):
            if counts["inside"]:
                counts["reads"] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    inner = worker._score_and_accept

    def score_and_accept(*a, **kw):
        counts["inside"] = True
        counts["steps"] += 1
        try:
            return inner(*a, **kw)
        finally:
            counts["inside"] = False

    monkeypatch.setattr(worker, "_score_and_accept", score_and_accept)
    return counts


def _lp_table(out):
    """Per emitted position: {token: (logprob, rank)}."""
    return [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in out.logprobs]


@pytest.mark.forked
@pytest.mark.parametrize("mode", [None, "processed_logprobs"])
def test_one_read_per_step_and_logprobs_equal_no_spec(tiny_llama_dir, monkeypatch, mode):
    """Draft = target (every proposal accepted: multi-token steps): the greedy run with
    logprobs equals the run without speculation (ids, top-3 ids, ranks; logprobs to 1e-4)
    in the default logprobs_mode (raw: for the requests with penalties and logit_bias, the
    model's own logprobs, as its prompt logprobs give them) and in processed_logprobs (the
    penalized and biased ones), each scored step reads the device once, and a sampled
    run's emitted tokens carry logprobs and ranks consistent with their own top-3."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    from vllm import LLM, SamplingParams

    kw = {} if mode is None else {"logprobs_mode": mode}
    prompts = [{"prompt_token_ids": p} for p in ([5, 6, 7, 8], [100, 200, 300], [42] * 5)]
    greedy = [
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, repetition_penalty=1.5,
                       presence_penalty=0.5, logit_bias={300: 1.0}),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, frequency_penalty=0.7,
                       logit_bias={42: -2.0}),
    ]  # fmt: skip
    base_llm = LLM(model=tiny_llama_dir, device="cpu", max_num_seqs=4, **kw)
    base = [o.outputs[0] for o in base_llm.generate(prompts, greedy, use_tqdm=False)]
    # the model's own logprobs of the generated tokens: prompt logprobs (raw in every mode)
    echo = [{"prompt_token_ids": p["prompt_token_ids"] + list(b.token_ids)}
            for p, b in zip(prompts, base)]  # fmt: skip
    plp = SamplingParams(max_tokens=1, prompt_logprobs=0)
    model_lps = [o.prompt_logprobs for o in base_llm.generate(echo, plp, use_tqdm=False)]
    base_llm.llm_engine.shutdown()
    for i in (1, 2):
        n = len(prompts[i]["prompt_token_ids"])
        got = [pos[t].logprob for t, pos in zip(base[i].token_ids, base[i].logprobs)]
        own = [pos[t].logprob for t, pos in zip(base[i].token_ids, model_lps[i][n:])]
        if mode is None:
            assert got == pytest.approx(own, abs=1e-4)
        else:
            assert max(abs(a - b) for a, b in zip(got, own)) > 1e-3  # 10x the tolerance
    llm = LLM(
        model=tiny_llama_dir, device="cpu", max_num_seqs=4,
        speculative_model=tiny_llama_dir, num_speculative_tokens=3, **kw,
    )  # fmt: skip
    counts = _count_reads(monkeypatch, llm.llm_engine.executor.worker)
    spec = [o.outputs[0] for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert counts["steps"] > 0 and counts["reads"] == counts["steps"], counts
    for b, s in zip(base, spec):
        assert list(b.token_ids) == list(s.token_ids)
        for pb, ps in zip(_lp_table(b), _lp_table(s)):
            assert pb.keys() == ps.keys()
            for t in pb:
                assert pb[t][1] == ps[t][1] and abs(pb[t][0] - ps[t][0]) < 1e-4
    m = llm.llm_engine.spec_decode_metrics()
    assert m["num_accepted_tokens"] == m["num_draft_tokens"] > 0
    counts.update(reads=0, steps=0)
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=12, logprobs=3)
    outs = [o.outputs[0] for o in llm.generate(prompts, sampled, use_tqdm=False)]
    assert counts["steps"] > 0 and counts["reads"] == counts["steps"], counts
    for o in outs:
        assert len(o.token_ids) == 12
        for tok, pos in zip(o.token_ids, _lp_table(o)):
            lp, rank = pos[tok]
            others = [v[0] for t, v in pos.items() if t != tok]
            assert lp <= 0.0
            if rank <= 3:  # among the top-3: rank - 1 of them lie above it
                assert sum(x > lp for x in others) == rank - 1, pos
            else:  # below all of the top-3
                assert len(others) == 3 and min(others) >= lp, pos
    llm.llm_engine.shutdown()
