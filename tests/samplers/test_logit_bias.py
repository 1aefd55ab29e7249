"""logit_bias (OpenAI semantics) and allowed_token_ids on every decoding path: one-token
steps, multi-step decoding, n-gram speculation (greedy acceptance and the rejection
sampler's target probabilities) and the Triton greedy fast path; plus their validation."""

import pytest
import torch

# token ids; the last prompt repeats a span so that n-gram speculation proposes
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7],
    [100, 200, 300, 400],
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12],
]
MAX_TOKENS = 12
SETTINGS = {
    "one_step": {},
    "multi_step": dict(num_scheduler_steps=4),
    "ngram": dict(speculative_model="[ngram]", num_speculative_tokens=3, ngram_prompt_lookup_max=2),
}


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


def _generate(llm, params) -> list[list[int]]:
    """Token ids per prompt; ``params`` is one SamplingParams or one per prompt."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _cases(llm):
    """Outputs of the biased requests (and the unbiased baseline) on one engine."""
    from vllm import SamplingParams

    def sp(**kw):
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **kw)

    base = _generate(llm, sp())
    top = base[0][0]  # prompt 0's greedy first token
    forced = 4242
    res = {"base": base, "top": top, "forced": forced}
    res["minus_top"] = _generate(llm, sp(logit_bias={top: -100}))
    res["plus_forced"] = _generate(llm, sp(logit_bias={forced: 100}))
    res["allowed"] = _generate(llm, sp(allowed_token_ids=[17, 4242, 30000]))
    # a batch mixing a biased request with unbiased ones: the bias stays on its row
    res["mixed"] = _generate(llm, [sp(logit_bias={forced: 100}), sp(), sp()])
    seeded = SamplingParams(
        temperature=1.0, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True, logit_bias={forced: 100}
    )
    res["sampled_forced"] = _generate(llm, seeded)
    return res


def _engine_cases(model, **kw):
    from vllm import LLM

    llm = LLM(model=model, device="cpu", dtype="float32", **kw)
    try:
        res = _cases(llm)
        res["metrics"] = llm.llm_engine.spec_decode_metrics()
        return res
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.forked
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_logit_bias_on_every_decoding_path(tiny_llama_dir, setting):
    ref = _engine_cases(tiny_llama_dir)
    base, top, forced = ref["base"], ref["top"], ref["forced"]
    assert all(len(set(ids)) >= 4 for ids in base), base  # not one repeated token
    assert forced not in base[0]
    # -100 on the top token: it is never chosen, so the output changes from the first token
    assert all(top not in ids for ids in ref["minus_top"])
    assert ref["minus_top"][0][0] != base[0][0]
    # +100 forces the chosen token at every position, greedy or sampled
    assert ref["plus_forced"] == [[forced] * MAX_TOKENS] * len(PROMPTS)
    assert ref["sampled_forced"] == [[forced] * MAX_TOKENS] * len(PROMPTS)
    assert all(set(ids) <= {17, 4242, 30000} for ids in ref["allowed"])
    assert ref["mixed"] == [[forced] * MAX_TOKENS, base[1], base[2]]
    if setting == "one_step":
        return
    got = _engine_cases(tiny_llama_dir, **SETTINGS[setting])
    for key in ("base", "minus_top", "plus_forced", "allowed", "mixed", "sampled_forced"):
        assert got[key] == ref[key], key  # float32 CPU: exact against one-token steps
    if setting == "ngram":
        m = got["metrics"]
        assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0, m


def _metadata(params_list, vocab=64):
    from vllm.model_executor.sampling_metadata import SamplingMetadata
    from vllm.sequence import SequenceData, SequenceGroupMetadata

    mds = [
        SequenceGroupMetadata(f"r{i}", False, {i: SequenceData((1, 2), [3])}, p, {i: [0]})
        for i, p in enumerate(params_list)
    ]
    return SamplingMetadata.build(mds, [1] * len(mds), vocab, torch.device("cpu"), {})


def test_bias_rows_and_decode_loop_eligibility():
    from vllm import SamplingParams
    from vllm.cudagraph.decode_loop import eligible

    plain = SamplingParams(temperature=0.0)
    sm = _metadata([plain, plain])
    assert sm.logit_bias is None and eligible(sm)
    biased = SamplingParams(temperature=0.0, logit_bias={3: 2.5, "5": -1})
    allowed = SamplingParams(temperature=0.0, allowed_token_ids=[1, 9], logit_bias={9: 4})
    sm = _metadata([plain, biased, allowed])
    assert sm.all_greedy and not eligible(sm)  # a loop graph would skip the bias
    bias = sm.logit_bias
    assert bias.shape == (3, 64) and bias.dtype == torch.float32
    assert bias[0].eq(0).all()
    assert bias[1, 3] == 2.5 and bias[1, 5] == -1 and bias[1].ne(0).sum() == 2
    assert bias[2, 1] == 0 and bias[2, 9] == 4 and bias[2].isinf().sum() == 62


def test_triton_greedy_path_sees_the_bias(monkeypatch):
    """The Triton greedy fast path (CUDA) samples from the biased logits: a fake kernel
    module records what it is given. It reports the log_softmax of what it is given, so it
    serves a biased batch only under processed_logprobs; the default raw logprobs take the
    torch path, which reports the unbiased values."""
    from vllm import SamplingParams
    from vllm.model_executor.layers import sampler as sampler_mod

    seen = []

    class FakeGreedy:
        @staticmethod
        def greedy_pack(x):
            seen.append(x.clone())
            ids = x.argmax(dim=-1)
            lp = torch.log_softmax(x, dim=-1).gather(1, ids[:, None])
            return ids, torch.cat(
                [ids[:, None].double(), lp.double(), torch.ones_like(lp).double()], 1
            )

    monkeypatch.setattr(sampler_mod, "get_triton_greedy", lambda x: FakeGreedy)
    logits = torch.zeros(2, 64)
    logits[:, 10] = 5.0  # the unbiased argmax
    params = [
        SamplingParams(temperature=0.0, logit_bias={20: 100}),
        SamplingParams(temperature=0.0),
    ]
    sm = _metadata(params)
    sm.logprobs_mode = "processed_logprobs"
    ids, packed, k = sampler_mod.Sampler.sample_on_device(logits, sm)
    assert len(seen) == 1 and seen[0][0, 20] == 100.0 and seen[0][1, 20] == 0.0
    assert ids.tolist() == [20, 10] and k == 0
    ids, packed, k = sampler_mod.Sampler.sample_on_device(logits, _metadata(params))
    assert len(seen) == 1 and ids.tolist() == [20, 10] and k == 0
    raw = torch.log_softmax(logits, -1)
    assert packed[:, 1].tolist() == pytest.approx([raw[0, 20].item(), raw[1, 10].item()])
    assert packed[:, 2].tolist() == [2.0, 1.0]  # ranks of the raw values


BAD_KEY = "logit_bias keys must be token ids (integers >= 0), got 'abc'"
BAD_VALUE = "logit_bias value for token 5 must be a number in [-100, 100], got 100.5"


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(logit_bias={"abc": 1}), BAD_KEY),
        (dict(logit_bias={-3: 1}), "got -3"),
        (dict(logit_bias={5: 100.5}), BAD_VALUE),
        (dict(logit_bias={5: "x"}), "got 'x'"),
        (dict(logit_bias=[5]), "logit_bias must be a dict"),
        (dict(allowed_token_ids=[]), "allowed_token_ids must list at least one token id"),
        (dict(allowed_token_ids=[1, -2]), "allowed_token_ids must be integers >= 0, got -2"),
    ],
)
def test_sampling_params_validation(kw, message):
    from vllm import SamplingParams

    with pytest.raises(ValueError) as info:
        SamplingParams(**kw)
    assert message in str(info.value)


def test_string_keys_become_token_ids():
    from vllm import SamplingParams

    p = SamplingParams(logit_bias={"7": 1, 8: -2.5})
    assert p.logit_bias == {7: 1.0, 8: -2.5}
    assert p.clone().logit_bias == {7: 1.0, 8: -2.5}
    assert SamplingParams(logit_bias={}).logit_bias is None


@pytest.mark.forked
def test_out_of_vocab_ids_are_refused(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(model=tiny_llama_dir, device="cpu", skip_tokenizer_init=True)
    vocab = llm.llm_engine.model_config.vocab_size
    try:
        for kw, name in (
            (dict(logit_bias={vocab: 1.0, 3: 1.0}), "logit_bias"),
            (dict(allowed_token_ids=[3, vocab + 5]), "allowed_token_ids"),
        ):
            with pytest.raises(ValueError) as info:
                llm.llm_engine.add_request("r", [1, 2], SamplingParams(**kw))
            bad = vocab if name == "logit_bias" else vocab + 5
            assert str(info.value) == (
                f"{name} token ids [{bad}] are out of vocabulary (valid ids: 0..{vocab - 1})."
            )
    finally:
        llm.llm_engine.shutdown()
