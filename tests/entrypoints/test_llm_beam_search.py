"""``LLM.beam_search``: the search rules on hand-made logprobs (EOS completion, length
penalty, limits), then the engine's beams against an independent full-vocabulary beam search
over transformers' logits on the same weights, and width 1 against greedy decoding."""

import pytest

from vllm.beam_search import BeamSearch, beam_score
from vllm.sampling_params import BeamSearchParams
from vllm.sequence import Logprob

EOS = 0


def _lps(**by_token):
    """{token id: Logprob} from keyword t<id>=logprob."""
    return {int(k[1:]): Logprob(v) for k, v in by_token.items()}


class _SpacedIds:
    """A tokenizer stand-in whose text is the ids joined by spaces."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class _ListIds:
    """A tokenizer stand-in whose text is ``str(ids)``."""

    def decode(self, ids, skip_special_tokens=False):
        return str(ids)


def test_eos_completes_a_beam_and_length_penalty_ranks():
    params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=1.0)
    search = BeamSearch([[5, 6]], params, eos_ids={EOS}, max_model_len=100)
    assert search.pending() == [(0, 0, [5, 6])]
    search.advance({(0, 0): _lps(t0=-0.1, t7=-1.0, t8=-2.0, t9=-3.0)})
    # EOS (the likeliest) completes; 7 and 8 live on, 9 is beyond the width.
    assert [b.tokens for b in search.live[0]] == [[5, 6, 7], [5, 6, 8]]
    assert [(b.tokens, b.finish_reason) for b in search.completed[0]] == [([5, 6, 0], "stop")]
    search.advance({(0, 0): _lps(t1=-0.5, t2=-0.6), (0, 1): _lps(t3=-0.1, t4=-3.0)})
    assert [b.tokens for b in search.live[0]] == [[5, 6, 7, 1], [5, 6, 7, 2]]
    assert search.live[0][0].cum_logprob == pytest.approx(-1.5)
    search.advance({(0, 0): _lps(t1=-0.5, t2=-0.6), (0, 1): _lps(t3=-0.1, t4=-3.0)})
    assert search.done  # max_tokens reached: the live beams completed with "length"
    outs = search.outputs(_SpacedIds())[0].sequences
    # Scores: EOS beam -0.1 / 2 (its EOS not counted); [7, 2, 3] -1.7 / 5; [7, 1, 1] -2.0 / 5.
    assert [s.tokens for s in outs] == [[5, 6, 0], [5, 6, 7, 2, 3]]
    assert [s.text for s in outs] == ["", "7 2 3"]
    assert [s.finish_reason for s in outs] == ["stop", "length"]
    assert beam_score(outs[1], {EOS}, 1.0) == pytest.approx(-1.7 / 5)
    # length_penalty 0 ranks by cumulative logprob alone; the stop token's text is kept on
    # request.
    params0 = BeamSearchParams(2, 1, length_penalty=0.0, include_stop_str_in_output=True)
    s0 = BeamSearch([[5]], params0, {EOS}, 100)
    s0.advance({(0, 0): _lps(t0=-0.3, t7=-0.2)})
    assert [(s.tokens, s.text) for s in s0.outputs(_ListIds())[0].sequences] == [
        ([5, 7], "[7]"), ([5, 0], "[0]"),
    ]  # fmt: skip


def test_ignore_eos_max_model_len_and_bad_params():
    params = BeamSearchParams(beam_width=1, max_tokens=10, ignore_eos=True)
    search = BeamSearch([[1, 2, 3]], params, {EOS}, max_model_len=4)
    search.advance({(0, 0): _lps(t0=-0.1, t5=-1.0)})
    assert search.done and search.completed[0][0].tokens == [1, 2, 3, 0]
    assert search.completed[0][0].finish_reason == "length"  # the model's length limit
    # a prompt of exactly max_model_len tokens still gets one token per beam
    full = BeamSearch([[1, 2, 3, 4]], BeamSearchParams(2, 5), {EOS}, max_model_len=4)
    assert full.pending() == [(0, 0, [1, 2, 3, 4])]
    full.advance({(0, 0): _lps(t5=-0.1, t6=-1.0)})
    assert full.done and [b.tokens for b in full.completed[0]] == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]
    with pytest.raises(ValueError, match="beam_width must be at least 1, got 0"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="needs 22 logprobs per step, more than max_logprobs=20"):
        BeamSearchParams(beam_width=11, max_tokens=4).check_limits(20)


def _hf_beam_search(model, prompt_ids, width, steps, temperature=1.0):
    """Plain beam search over the full vocabulary (no EOS): the ``width`` best continuations
    by cumulative logprob (of the logits divided by ``temperature``) after ``steps`` tokens,
    as (tokens, cum_logprob), best first."""
    import torch

    beams = [(list(prompt_ids), 0.0)]
    for _ in range(steps):
        cands = []
        for toks, cum in beams:
            with torch.no_grad():
                logits = model(torch.tensor([toks])).logits[0, -1].double()
            lp = torch.log_softmax(logits / temperature, -1)
            top = torch.topk(lp, width)
            for v, t in zip(top.values.tolist(), top.indices.tolist()):
                cands.append((toks + [t], cum + v))
        beams = sorted(cands, key=lambda c: -c[1])[:width]
    return beams


@pytest.mark.forked
def test_beams_equal_a_full_vocabulary_search_on_transformers(tiny_llama_dir):
    import gc

    from tests.utils import load_hf_model, vllm_greedy
    from vllm import LLM

    hf, _ = load_hf_model(tiny_llama_dir)
    prompts = [[11, 42, 7, 99, 5], [300, 12, 8]]
    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=64)
    params = BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    assert len(outs) == 2
    for p, out in zip(prompts, outs):
        ref = _hf_beam_search(hf, p, 3, 4)
        assert [s.tokens for s in out.sequences] == [t for t, _ in ref], p
        for seq, (_, cum) in zip(out.sequences, ref):
            assert seq.cum_logprob == pytest.approx(cum, abs=2e-4)
            assert seq.finish_reason == "length" and len(seq.logprobs) == 4
        assert len({tuple(s.tokens) for s in out.sequences}) == 3
    # The beams follow the engine's logprobs_mode, as upstream: the default (raw) scores
    # are the model's own, whatever the temperature ...
    hot = BeamSearchParams(beam_width=3, max_tokens=3, ignore_eos=True, temperature=0.5)
    out = llm.beam_search([{"prompt_token_ids": prompts[0]}], hot)[0]
    ref = _hf_beam_search(hf, prompts[0], 3, 3)
    assert [s.tokens for s in out.sequences] == [t for t, _ in ref]
    for seq, (_, cum) in zip(out.sequences, ref):
        assert seq.cum_logprob == pytest.approx(cum, abs=2e-4)
    # Width 1 is greedy decoding; a text prompt gets the generated text.
    one = llm.beam_search("The capital of France is", BeamSearchParams(1, 6, ignore_eos=True))
    greedy = vllm_greedy(llm, ["The capital of France is"], 6)[0]
    gen = one[0].sequences[0].tokens[-6:]
    assert gen == greedy[0] and one[0].sequences[0].text == greedy[1]
    with pytest.raises(ValueError, match="max_logprobs=20"):
        llm.beam_search("x", BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match=r"prompt \(70 tokens\) is longer than max_model_len=64"):
        llm.beam_search({"prompt_token_ids": [5] * 70}, BeamSearchParams(3, 4))
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    # ... while processed_logprobs scores the logits divided by the temperature.
    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=64,
              logprobs_mode="processed_logprobs")  # fmt: skip
    out = llm.beam_search([{"prompt_token_ids": prompts[0]}], hot)[0]
    ref = _hf_beam_search(hf, prompts[0], 3, 3, temperature=0.5)
    assert [s.tokens for s in out.sequences] == [t for t, _ in ref]
    for seq, (_, cum) in zip(out.sequences, ref):
        assert seq.cum_logprob == pytest.approx(cum, abs=2e-4)


@pytest.mark.forked
def test_beams_keep_the_prompts_cache_salt(tiny_llama_dir):
    """A prompt's ``cache_salt`` reaches every beam request: a salted search finds none of
    the blocks an unsalted request cached, and a later request of that salt finds the blocks
    the search cached (the beams once ran unsalted, sharing blocks across salts)."""
    from vllm import LLM, SamplingParams

    bs = 4
    prompt = [11, 42, 7, 99, 5, 300, 12, 8, 61, 17]  # two full blocks and a partial one
    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", max_model_len=64,
              block_size=bs, enable_prefix_caching=True)  # fmt: skip
    bm = llm.llm_engine.schedulers[0].block_manager
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    plain = llm.beam_search([{"prompt_token_ids": prompt}], params)[0]
    # steps 2 and 3 run 2 beams each, and each beam finds the prompt's 2 full blocks
    assert bm.num_hit_tokens == 4 * 2 * bs
    llm.reset_prefix_cache()
    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([{"prompt_token_ids": prompt}], one, use_tqdm=False)  # caches 2 blocks
    hits = bm.num_hit_tokens
    salted = llm.beam_search([{"prompt_token_ids": prompt, "cache_salt": "s"}], params)[0]
    assert [(s.tokens, s.cum_logprob) for s in salted.sequences] == [
        (s.tokens, s.cum_logprob) for s in plain.sequences
    ]
    # step 1 finds nothing of the unsalted blocks; the later steps find its salted ones
    assert bm.num_hit_tokens - hits == 4 * 2 * bs
    (out,) = llm.generate([{"prompt_token_ids": prompt + [3], "cache_salt": "s"}], one,
                          use_tqdm=False)  # fmt: skip
    assert out.num_cached_tokens == 2 * bs
