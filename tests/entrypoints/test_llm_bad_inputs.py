"""Every bad input to LLM.generate raises a clear ValueError naming the value (and the
limit), queues nothing, and leaves the LLM usable: a later greedy run gives the same
output as before."""

import os

import numpy as np
import pytest

from vllm import LLM, PoolingParams, SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPT = {"prompt_token_ids": [1, 504, 2988, 314, 42, 216, 34]}

# (name, callable(llm) that must raise, regex the message must match)
PARAM_CASES = [
    ("max_tokens=0", dict(max_tokens=0), r"max_tokens must be an integer >= 1.*got 0"),
    ("max_tokens<0", dict(max_tokens=-3), r"max_tokens.*got -3"),
    ("temperature<0", dict(temperature=-0.5), r"temperature must be >= 0.*got -0.5"),
    ("top_p=0", dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p>1", dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    ("top_k<-1", dict(top_k=-2), r"top_k must be 0 or -1 \(disable\), or at least 1, got -2"),
    ("min_p<0", dict(min_p=-0.1), r"min_p must be in \[0, 1\], got -0.1"),
    ("min_p>1", dict(min_p=1.1), r"min_p must be in \[0, 1\], got 1.1"),
    ("n=0", dict(n=0), r"n must be an integer >= 1, got 0"),
    ("logprobs<-1", dict(logprobs=-2), r"logprobs must be >= 0, or -1 .*got -2"),
    ("prompt_logprobs<-1", dict(prompt_logprobs=-2), r"prompt_logprobs must be >= 0.*got -2"),
    ("empty stop", dict(stop=["ok", ""]), r"stop strings must be non-empty.*got ''"),
    ("stop not a list", dict(stop=5), r"stop must be a string or a list of strings, got 5"),
    ("presence", dict(presence_penalty=3.0), r"presence_penalty must be in \[-2, 2\], got 3.0"),
    ("repetition", dict(repetition_penalty=0.0), r"repetition_penalty.*got 0.0"),
    ("min>max tokens", dict(min_tokens=5, max_tokens=2), r"min_tokens.*max_tokens=2.*got 5"),
    (
        "seed>int64",
        dict(seed=2**64),
        r"seed must be a 64-bit signed integer.*got 18446744073709551616",
    ),
    ("seed<int64", dict(seed=-(2**63) - 1), r"seed must be a 64-bit.*got -9223372036854775809"),
    ("logprobs float", dict(logprobs=2.5), r"logprobs must be an integer, got 2.5 \(float\)"),
    ("temperature str", dict(temperature="0.5"), r"temperature must be a number, got '0.5'"),
    ("temperature inf", dict(temperature=float("inf")),
     r"temperature must be a finite number, got inf"),
    ("repetition inf", dict(repetition_penalty=float("inf")),
     r"repetition_penalty must be a finite number, got inf"),
    ("top_p nan", dict(top_p=float("nan")), r"top_p must be a finite number, got nan"),
    ("truncate 0", dict(truncate_prompt_tokens=0), r"truncate_prompt_tokens must be >= 1.*got 0"),
    ("seed str", dict(seed="1"), r"seed must be an integer, got '1' \(str\)"),
    ("logits_processors", dict(logits_processors=[lambda ids, logits: logits]),
     r"logits_processors are not supported.*use logit_bias"),
]  # fmt: skip


@pytest.mark.parametrize("name,kwargs,match", PARAM_CASES, ids=[c[0] for c in PARAM_CASES])
def test_bad_sampling_params(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(length_penalty=float("nan")), r"length_penalty must be a finite number, got nan"),
        (dict(temperature=float("inf")), r"temperature must be a finite number >= 0, got inf"),
        (dict(temperature=-1.0), r"temperature must be a finite number >= 0, got -1.0"),
    ],
)
def test_bad_beam_search_params(kwargs, match):
    from vllm.sampling_params import BeamSearchParams

    with pytest.raises(ValueError, match=match):
        BeamSearchParams(beam_width=2, max_tokens=4, **kwargs)


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
        ("id >= vocab", lambda: llm.generate([[1, 5, vocab]], greedy),
         rf"Token id {vocab} is out of vocabulary \(valid ids: 0..{vocab - 1}\)"),
        ("id < 0", lambda: llm.generate({"prompt_token_ids": [3, -1]}, greedy),
         r"Token id -1 is out of vocabulary"),
        ("bad among good",
         lambda: llm.generate([PROMPT, {"prompt_token_ids": [vocab + 7]}], greedy),
         rf"Token id {vocab + 7}"),
        ("stop token >= vocab",
         lambda: llm.generate(PROMPT, SamplingParams(stop_token_ids=[vocab])),
         rf"stop_token_ids entry {vocab} is out of vocabulary"),
        ("logprobs > max_logprobs", lambda: llm.generate(PROMPT, SamplingParams(logprobs=21)),
         r"logprobs=21 is more than max_logprobs=20"),
        ("prompt_logprobs > max_logprobs",
         lambda: llm.generate(PROMPT, SamplingParams(prompt_logprobs=50)),
         r"prompt_logprobs=50 is more than max_logprobs=20"),
        ("n far above max_num_seqs", lambda: llm.generate(PROMPT, SamplingParams(n=2**63)),
         r"n=9223372036854775808 sequences are more than max_num_seqs=256"),
        ("params count", lambda: llm.generate([PROMPT, PROMPT], [greedy]),
         r"got 1 sampling params for 2"),
        ("empty chat", lambda: llm.chat([], greedy), r"messages is empty"),
        ("too long", lambda: llm.generate([PROMPT, list(range(1, 258))], greedy),
         r"The prompt \(257 tokens\) is longer than max_model_len=256"),
        ("multimodal", lambda: llm.generate({"prompt": "hi", "multi_modal_data": {"image": 1}}),
         r"\['multi_modal_data'\] are not supported: this engine serves text-only"),
        ("truncate > max_model_len",
         lambda: llm.generate(PROMPT, SamplingParams(truncate_prompt_tokens=300)),
         r"truncate_prompt_tokens=300 is more than max_model_len=256"),
        ("lora", lambda: llm.generate(PROMPT, greedy, lora_request=object()),
         r"names a LoRA adapter but the engine runs without LoRA"),
        ("priority", lambda: llm.generate(PROMPT, greedy, priority=[1]),
         r"got priority=1 but priority scheduling is not enabled"),
        ("params as a dict", lambda: llm.generate(PROMPT, {"max_tokens": 3}),
         r"sampling_params must be SamplingParams or a list of them \(one per prompt\), "
         r"got dict"),
        ("pooling params", lambda: llm.generate([PROMPT], PoolingParams()),
         r"sampling_params must be SamplingParams .*got PoolingParams"),
        ("prompt a number", lambda: llm.generate(123, greedy),
         r"prompts must be a string, a prompt dict, .*got int"),
        ("float id", lambda: llm.generate({"prompt_token_ids": [1, 504.0]}, greedy),
         r"Token id 504.0 is not an integer"),
        ("reward", lambda: llm.reward("hi"), r"LLM.reward is not supported"),
        ("ids None", lambda: llm.generate({"prompt_token_ids": None}, greedy),
         r"prompt_token_ids must be a list of token ids, got None"),
        ("prompt not text", lambda: llm.generate({"prompt": 5}, greedy),
         r"'prompt' must be a string, got 5"),
        ("chat text", lambda: llm.chat("hi", greedy), r"messages must be a list .*got str"),
        ("chat no role", lambda: llm.chat([{"content": "x"}], greedy),
         r"messages\[0\] must be a dict with a 'role'"),
    ]  # fmt: skip
    for name, call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
        assert not llm.llm_engine.has_unfinished_requests(), name
    for _name, kwargs, match in PARAM_CASES:  # raised while building the params
        with pytest.raises(ValueError, match=match):
            llm.generate(PROMPT, SamplingParams(**kwargs))
    assert llm.generate([], greedy) == []  # as upstream: nothing to do
    with pytest.raises(ValueError, match="need an embedding engine: start it with task='embed'"):
        llm.embed("hi")
    with pytest.raises(ValueError, match="LLM.score needs an embedding engine"):
        llm.score("a", "b")
    # truncate_prompt_tokens keeps the last k tokens: the same as sending them alone.
    cut = SamplingParams(temperature=0.0, max_tokens=6, truncate_prompt_tokens=4)
    kept = llm.generate(PROMPT, cut, use_tqdm=False)[0]
    last4 = {"prompt_token_ids": PROMPT["prompt_token_ids"][-4:]}
    alone = llm.generate(last4, SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]
    assert kept.prompt_token_ids == PROMPT["prompt_token_ids"][-4:]
    assert kept.outputs[0].token_ids == alone.outputs[0].token_ids
    after = llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0]
    assert list(after.token_ids) == list(before.token_ids) and after.text == before.text
    # numpy integer ids are ints, in a prompt dict, as a bare list and in SamplingParams
    np_list = list(np.array(PROMPT["prompt_token_ids"], dtype=np.int64))
    np_greedy = SamplingParams(temperature=0.0, max_tokens=np.int64(12))
    for prompt in ({"prompt_token_ids": np_list}, np_list):
        got = llm.generate(prompt, np_greedy, use_tqdm=False)[0].outputs[0].token_ids
        assert got == after.token_ids
    # With max_logprobs=-1 the vocabulary size is the limit.
    llm.llm_engine.model_config.max_logprobs = -1
    with pytest.raises(ValueError, match=rf"logprobs={vocab + 1} is more than the vocab"):
        llm.generate(PROMPT, SamplingParams(logprobs=vocab + 1))
    assert len(llm.generate(PROMPT, SamplingParams(logprobs=25, max_tokens=2))[0].outputs[0]
               .logprobs[0]) >= 25  # fmt: skip


@pytest.mark.forked
def test_failed_step_leaves_llm_usable(tiny_llama_dir):
    """A step that raises inside the engine fails that generate() call only: its requests
    are aborted, and the next call runs as if it had not happened."""
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=256)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    before = llm.generate([PROMPT, PROMPT], greedy, use_tqdm=False)
    executor = llm.llm_engine.executor
    real = executor.execute_model
    calls = []

    def fail_second(req):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected step failure")
        return real(req)

    executor.execute_model = fail_second
    with pytest.raises(RuntimeError, match="injected step failure"):
        llm.generate([PROMPT, PROMPT], greedy, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    after = llm.generate([PROMPT, PROMPT], greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in before]
    assert len(calls) > 3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_model_len="128"), r"max_model_len must be an int or None, got '128' \(str\)"),
        (dict(max_num_seqs=2.5), r"max_num_seqs must be an int, got 2.5"),
        (dict(task="score"), r"task='score' is not supported; use one of"),
        (dict(runner="draft"), r"runner='draft' is not supported"),
        (
            dict(
                enable_lora=True,
                speculative_model="[ngram]",
                num_speculative_tokens=2,
                ngram_prompt_lookup_max=2,
            ),
            r"enable_lora=True cannot be combined with speculative decoding",
        ),  # fmt: skip
        (dict(enable_lora=True, max_loras=0), r"max_loras must be at least 1, got 0"),
        (dict(enable_chunked_prefill="false"), r"enable_chunked_prefill must be a bool, got"),
    ],
)
def test_bad_engine_args_name_the_field(kwargs, match, tiny_llama_dir):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_llama_dir, device="cpu", **kwargs)


def test_engine_args_accept_upstream_spellings():
    """seed=None and a torch.dtype are accepted (as upstream) and normalized."""
    import torch

    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model="m", seed=None, dtype=torch.bfloat16, max_num_seqs=8)
    args._check_types()
    assert (args.seed, args.dtype, args.max_num_seqs) == (0, "bfloat16", 8)


@pytest.mark.forked
def test_stop_strings_without_a_tokenizer(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=r"stop strings \['a'\] need a tokenizer"):
        llm.generate([1, 2, 3], SamplingParams(max_tokens=3, stop=["a"]))
    out = llm.generate([1, 2, 3], SamplingParams(max_tokens=3))[0]
    assert len(out.outputs[0].token_ids) == 3
