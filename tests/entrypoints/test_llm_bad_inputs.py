"""Every bad input to LLM.generate raises a clear ValueError naming the value (and the
limit), queues nothing, and leaves the LLM usable: a later greedy run gives the same
output as before."""

import os

import pytest

from vllm import LLM, SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPT = {"prompt_token_ids": [1, 504, 2988, 314, 42, 216, 34]}

# (name, callable(llm) that must raise, regex the message must match)
PARAM_CASES = [
    ("max_tokens=0", dict(max_tokens=0), r"max_tokens must be an integer >= 1.*got 0"),
    ("max_tokens<0", dict(max_tokens=-3), r"max_tokens.*got -3"),
    ("temperature<0", dict(temperature=-0.5), r"temperature must be >= 0.*got -0.5"),
    ("top_p=0", dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p>1", dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    ("top_k=0", dict(top_k=0), r"top_k must be -1 \(disable\), or at least 1, got 0"),
    ("top_k<-1", dict(top_k=-2), r"top_k.*got -2"),
    ("min_p<0", dict(min_p=-0.1), r"min_p must be in \[0, 1\], got -0.1"),
    ("min_p>1", dict(min_p=1.1), r"min_p must be in \[0, 1\], got 1.1"),
    ("n=0", dict(n=0), r"n must be an integer >= 1, got 0"),
    ("logprobs<0", dict(logprobs=-1), r"logprobs must be >= 0, got -1"),
    ("prompt_logprobs<0", dict(prompt_logprobs=-2), r"prompt_logprobs must be >= 0, got -2"),
    ("empty stop", dict(stop=["ok", ""]), r"stop strings must be non-empty.*got ''"),
    ("presence", dict(presence_penalty=3.0), r"presence_penalty must be in \[-2, 2\], got 3.0"),
    ("repetition", dict(repetition_penalty=0.0), r"repetition_penalty.*got 0.0"),
    ("min>max tokens", dict(min_tokens=5, max_tokens=2), r"min_tokens.*max_tokens=2.*got 5"),
]


@pytest.mark.parametrize("name,kwargs,match", PARAM_CASES, ids=[c[0] for c in PARAM_CASES])
def test_bad_sampling_params(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.forked
def test_bad_inputs_leave_llm_usable(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=256)
    vocab = llm.llm_engine.model_config.vocab_size
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0]
    assert len(set(before.token_ids)) > 3

    cases = [
        ("empty text", lambda: llm.generate("", greedy), r"prompt is empty"),
        ("empty ids", lambda: llm.generate({"prompt_token_ids": []}, greedy), r"prompt is empty"),
        ("empty list", lambda: llm.generate([], greedy), r"prompts is empty"),
        ("id >= vocab", lambda: llm.generate([[1, 5, vocab]], greedy),
         rf"Token id {vocab} is out of vocabulary \(valid ids: 0..{vocab - 1}\)"),
        ("id < 0", lambda: llm.generate({"prompt_token_ids": [3, -1]}, greedy),
         r"Token id -1 is out of vocabulary"),
        ("bad among good",
         lambda: llm.generate([PROMPT, {"prompt_token_ids": [vocab + 7]}], greedy),
         rf"Token id {vocab + 7}"),
        ("stop token >= vocab",
         lambda: llm.generate(PROMPT, SamplingParams(stop_token_ids=[vocab])),
         rf"stop token id {vocab} is out of vocabulary"),
        ("logprobs > vocab", lambda: llm.generate(PROMPT, SamplingParams(logprobs=vocab + 1)),
         rf"logprobs={vocab + 1} is more than the vocabulary size {vocab}"),
        ("params count", lambda: llm.generate([PROMPT, PROMPT], [greedy]),
         r"got 1 sampling params for 2"),
        ("empty chat", lambda: llm.chat([], greedy), r"messages is empty"),
    ]  # fmt: skip
    for name, call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
        assert not llm.llm_engine.has_unfinished_requests(), name
    for _name, kwargs, match in PARAM_CASES:  # raised while building the params
        with pytest.raises(ValueError, match=match):
            llm.generate(PROMPT, SamplingParams(**kwargs))
    after = llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0]
    assert list(after.token_ids) == list(before.token_ids) and after.text == before.text
