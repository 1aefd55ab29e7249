"""Sampling through the engine on the tiny Llama (SmolLM2 tokenizer): seeds, n > 1,
preemption, stop strings and tokens, streaming text, logprobs vs transformers."""

import gc
import os

import pytest

from vllm import LLM, SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPTS = [
    {"prompt_token_ids": [1, 504, 2988, 314, 42, 216, 34, 32, 33, 40]},
    {"prompt_token_ids": [1, 7042, 30, 198, 198, 504]},
    {"prompt_token_ids": [1, 2231, 40303, 218, 2988, 314, 7906, 240, 178, 44, 45, 46]},
]


def _llm(model, **kw):
    return LLM(model, device="cpu", block_size=16, max_model_len=256, **kw)


def _ids(out):
    return [list(c.token_ids) for c in out.outputs]


@pytest.mark.forked
def test_seeded_reproducible_alone_and_in_batches(tiny_llama_dir):
    llm = _llm(tiny_llama_dir)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24)
    alone = _ids(llm.generate(PROMPTS[0], seeded, use_tqdm=False)[0])
    assert len(set(alone[0])) > 5
    rand = SamplingParams(temperature=0.8, max_tokens=30, n=2)
    other_seed = SamplingParams(temperature=1.0, seed=5, max_tokens=10)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    for batch in (
        [(PROMPTS[1], rand), (PROMPTS[0], seeded)],
        [(PROMPTS[2], other_seed), (PROMPTS[1], greedy), (PROMPTS[0], seeded), (PROMPTS[0], rand)],
    ):
        outs = llm.generate([p for p, _ in batch], [s for _, s in batch], use_tqdm=False)
        mine = [o for (p, s), o in zip(batch, outs) if s is seeded]
        assert _ids(mine[0]) == alone
    # n=4 with a seed: 4 different streams, the first equal to n=1 with the same seed
    # (sequence i uses seed + i), and the whole group reproducible.
    n4 = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, n=4)
    a = _ids(llm.generate(PROMPTS[0], n4, use_tqdm=False)[0])
    assert len({tuple(x) for x in a}) == 4 and a[0] == alone[0]
    assert _ids(llm.generate(PROMPTS[0], n4, use_tqdm=False)[0]) == a
    # top_k=1 is greedy, whatever the temperature and seed
    g = llm.generate(PROMPTS, greedy, use_tqdm=False)
    k1 = llm.generate(PROMPTS, SamplingParams(temperature=2.0, top_k=1, max_tokens=24, seed=9),
                      use_tqdm=False)  # fmt: skip
    assert [_ids(o) for o in g] == [_ids(o) for o in k1]


@pytest.mark.forked
def test_n3_long_prompt_shares_its_prefill(tiny_llama_dir):
    """n = 3 of a 200-token prompt under a 256-token step budget: 600 prompt tokens, but
    with prefix caching the siblings share all but the prompt's last partial block (216
    tokens computed), so the request runs in one prefill, and each sequence equals the
    same prompt sampled alone with its seed (sequence i: seed + i). Without prefix
    caching, or with prompt logprobs (no cache read), it is refused before it is queued."""
    prompt = {"prompt_token_ids": [1] + [(7 * i) % 9000 + 30 for i in range(199)]}
    kw = dict(max_num_batched_tokens=256)
    llm = _llm(tiny_llama_dir, **kw)
    n3 = SamplingParams(temperature=1.0, seed=77, max_tokens=8, n=3)
    got = _ids(llm.generate(prompt, n3, use_tqdm=False)[0])
    alone = [
        _ids(
            llm.generate(
                prompt, SamplingParams(temperature=1.0, seed=77 + i, max_tokens=8), use_tqdm=False
            )[0]
        )[0]  # fmt: skip
        for i in range(3)
    ]
    assert got == alone and len({tuple(x) for x in got}) == 3
    with pytest.raises(ValueError, match=r"prefill of 600 tokens .* max_num_batched_tokens=256"):
        llm.generate(prompt, SamplingParams(n=3, prompt_logprobs=1, max_tokens=2))
    del llm
    gc.collect()
    plain = _llm(tiny_llama_dir, enable_prefix_caching=False, **kw)
    with pytest.raises(ValueError, match=r"prefill of 600 tokens"):
        plain.generate(prompt, n3)


@pytest.mark.forked
def test_n4_preemption_equals_plenty_of_blocks(tiny_llama_dir):
    """2 requests x n=4 x (12 + 40 tokens) need 32 blocks of 16; with 20 blocks the
    scheduler must preempt (recompute the whole group) and still return the same 4 seeded
    completions per request as with plenty of blocks."""
    prompts = [PROMPTS[2], {"prompt_token_ids": PROMPTS[2]["prompt_token_ids"][::-1]}]
    params = SamplingParams(temperature=1.0, seed=77, n=4, max_tokens=40, ignore_eos=True)
    results = []
    for blocks in (None, 20):
        llm = _llm(tiny_llama_dir, num_gpu_blocks_override=blocks)
        outs = llm.generate(prompts, params, use_tqdm=False)
        preempted = sum(s.num_cumulative_preemption for s in llm.llm_engine.schedulers)
        results.append(([_ids(o) for o in outs], [[c.text for c in o.outputs] for o in outs]))
        if blocks is not None:
            assert preempted > 0
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    assert results[0] == results[1]
    for group in results[0][0]:
        assert len(group) == 4 and all(len(x) == 40 for x in group)
        assert len({tuple(x) for x in group}) == 4


@pytest.mark.forked
def test_stop_strings_spanning_1_2_3_tokens_and_stop_tokens(tiny_llama_dir):
    llm = _llm(tiny_llama_dir)
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = llm.generate(PROMPTS[0], greedy, use_tqdm=False)[0].outputs[0]
    ids, text = list(ref.token_ids), ref.text
    assert text == tok.decode(ids)
    pieces = [tok.decode([i]) for i in ids]
    offsets = [sum(len(p) for p in pieces[:j]) for j in range(len(ids) + 1)]
    assert "".join(pieces) == text  # every piece is whole text: offsets are exact

    def find(span):
        """A stop string covering tokens j..j+span-1 (one char of the first and last
        token when span > 1) that does not occur earlier in the text."""
        for j in range(1, len(ids) - span):
            if span == 1:
                s = pieces[j]
            else:
                s = (
                    pieces[j][-1:]
                    + "".join(pieces[j + 1 : j + span - 1])
                    + pieces[j + span - 1][:1]
                )
            start = offsets[j + 1] - 1 if span > 1 else offsets[j]
            if s.strip() and len(pieces[j]) and text.find(s) == start:
                return s, start, j + span
        raise AssertionError(f"no stop string spanning {span} tokens in {pieces}")

    cases = [find(span) for span in (1, 2, 3)]
    batch = [(s, start, keep, inc) for s, start, keep in cases for inc in (False, True)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[s, "\x00never"],
                       include_stop_str_in_output=inc)
        for s, _, _, inc in batch
    ]  # fmt: skip
    outs = llm.generate([PROMPTS[0]] * len(batch), params, use_tqdm=False)
    for (s, start, keep, inc), o in zip(batch, outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == s, (s, c)
        assert c.text == (text[: start + len(s)] if inc else text[:start])
        assert list(c.token_ids) == ids[:keep]
    # Streamed, the text never shows the start of a stop string that the final text drops
    # (each case's first character ends token j, so it arrives a step before the rest).
    engine = llm.llm_engine
    for k, (s, start, keep) in enumerate(cases[1:]):
        p = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[s])
        engine.add_request(f"held-{k}", PROMPTS[0], p)
        seen = []
        while engine.has_unfinished_requests():
            seen += [out.outputs[0] for out in engine.step()]
        assert seen[-1].text == text[:start] and seen[-1].finish_reason == "stop"
        assert all(text[:start].startswith(c.text) for c in seen), (s, [c.text for c in seen])
        assert any(len(c.token_ids) == keep - 1 and not c.finished() for c in seen)
    # stop_token_ids: the token id is the reason; min_tokens masks it out first
    t = ids[2]
    c = llm.generate(PROMPTS[0], SamplingParams(temperature=0, stop_token_ids=[t], max_tokens=40),
                     use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert (c.finish_reason, c.stop_reason, list(c.token_ids)) == ("stop", t, ids[:3])
    assert c.text == tok.decode(ids[:2])
    p = SamplingParams(temperature=0, stop_token_ids=[t], min_tokens=6, max_tokens=12, logprobs=2)
    c = llm.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0]
    assert list(c.token_ids[:2]) == ids[:2] and t not in c.token_ids[:6]
    # masked, not generated; the default (raw) logprobs are the model's own, where t is
    # still the first choice after ids[:2]
    assert c.logprobs[2][t].rank == 1
    assert len(c.token_ids) >= 6


@pytest.mark.forked
def test_streaming_text_equals_final_text(tiny_llama_dir):
    """Random sampling on a random model emits many pieces of multi-byte characters;
    the streamed text only grows, and ends equal to the one-shot decode and to the
    non-streamed generate output."""
    llm = _llm(tiny_llama_dir)
    tok = llm.get_tokenizer()
    engine = llm.llm_engine
    params = SamplingParams(temperature=1.2, seed=11, n=3, max_tokens=48, ignore_eos=True)
    engine.add_request("s", PROMPTS[1], params)
    texts = [[""] for _ in range(3)]
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            for i, c in enumerate(out.outputs):
                assert c.text.startswith(texts[i][-1])
                texts[i].append(c.text)
            final = out
    assert final.finished
    for c in final.outputs:
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    again = llm.generate(PROMPTS[1], params, use_tqdm=False)[0]
    assert [c.text for c in again.outputs] == [c.text for c in final.outputs]
    assert len({c.text for c in final.outputs}) == 3


def _hf_logprobs(model_path, prompt_ids, gen_ids):
    import torch

    from tests.utils import load_hf_model

    hf, _ = load_hf_model(model_path)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt_ids + gen_ids[:-1]])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # [len - 1 + len(gen), vocab]


def check_logprobs_vs_hf(llm, model_path, prompt_ids, max_tokens, tol=1e-4):
    """Greedy logprobs=5 and prompt_logprobs=5 equal transformers' float32 log_softmax
    within ``tol`` (CPU float32 on both sides; only summation order differs); every entry
    carries its token's text as ``decoded_token``."""
    p = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=5, prompt_logprobs=5)
    out = llm.generate({"prompt_token_ids": prompt_ids}, p, use_tqdm=False)[0]
    c = out.outputs[0]
    tok = llm.get_tokenizer()
    ref = _hf_logprobs(model_path, prompt_ids, list(c.token_ids))
    L = len(prompt_ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == L
    for i in range(1, L):
        pos = out.prompt_logprobs[i]
        assert prompt_ids[i] in pos and len(pos) >= 5
        for t, lp in pos.items():
            assert abs(lp.logprob - ref[i - 1, t].item()) < tol, (i, t)
            assert lp.decoded_token == tok.decode([t])
            assert lp.rank == int((ref[i - 1] > ref[i - 1, t]).sum()) + 1
    assert len(c.logprobs) == len(c.token_ids)
    total = 0.0
    for j, (t, pos) in enumerate(zip(c.token_ids, c.logprobs)):
        row = ref[L - 1 + j]
        assert t == int(row.argmax()) and pos[t].rank == 1
        assert list(pos)[:5] == row.topk(5).indices.tolist()
        for tid, lp in pos.items():
            assert abs(lp.logprob - row[tid].item()) < tol, (j, tid)
            assert lp.decoded_token == tok.decode([tid])
        total += pos[t].logprob
    assert abs(c.cumulative_logprob - total) < 1e-6


@pytest.mark.forked
def test_logprobs_match_transformers_tiny_llama(tiny_llama_dir):
    llm = _llm(tiny_llama_dir)
    check_logprobs_vs_hf(llm, tiny_llama_dir, PROMPTS[2]["prompt_token_ids"], 12)


@pytest.mark.forked
def test_logprobs_match_transformers_smollm2(smollm2_gguf):
    llm = LLM(smollm2_gguf, device="cpu", max_model_len=128)
    ids = llm.get_tokenizer().encode("The capital of France is")
    check_logprobs_vs_hf(llm, smollm2_gguf, ids, 6)
