"""Structured outputs offline (CPU, float32): JSON schema, regex and choice constraints hold
for every output, greedy and seeded; unconstrained rows of a mixed batch are unchanged;
a compiling grammar holds back only its own request; multi-step decoding, n-gram
speculation and PP=2 give the plain run's constrained tokens; bad constraints raise a
ValueError naming the problem and leave the engine usable.

Each engine starts once per test and serves many requests."""

import json
import os
import re
import sys
from concurrent.futures import Future

import jsonschema
import pytest

from tests.structured_output.schemas import CHOICES, MAX_TOKENS, PERSON, REGEX
from vllm import LLM, SamplingParams
from vllm.sampling_params import GuidedDecodingParams, StructuredOutputsParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "0.25")

JSON_GD = GuidedDecodingParams(json=PERSON, disable_any_whitespace=True)
SUBJECTS = ["a cat", "my dog", "the fish", "a pet", "Rex", "Tom", "a bird", "Nemo", "Kit", "Bo"]
PROMPTS = [f"Describe {s} as JSON, variant {i}:" for i in range(5) for s in SUBJECTS][:25]
NGRAM_PROMPTS = [
    "red green blue, red green blue, red green blue, red green",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,",
]
PLAIN_PROMPTS = ["The capital of France is", "1, 2, 3, 4, 5, 6,", "def fibonacci(n):"]


def _json_requests(scale: int) -> tuple[list[str], list[SamplingParams]]:
    """10 x scale outputs: 4 x scale greedy, 4 x scale seeded sampled, scale seeded n=2."""
    prompts, params = [], []
    for p in PROMPTS[: 4 * scale]:
        prompts.append(p)
        params.append(SamplingParams(temperature=0, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD))
    for i, p in enumerate(PROMPTS[: 4 * scale]):
        prompts.append(p)
        params.append(
            SamplingParams(
                temperature=1.0, seed=100 + i, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD
            )
        )
    for i, p in enumerate(PROMPTS[20 : 20 + scale]):
        prompts.append(p)
        params.append(
            SamplingParams(
                n=2, temperature=0.8, seed=7 + i, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD
            )
        )
    return prompts, params


def _check_json_outputs(llm, scale: int) -> list:
    """Every one of 10 x ``scale`` outputs parses and validates against the schema."""
    prompts, params = _json_requests(scale)
    outs = llm.generate(prompts, params, use_tqdm=False)
    texts = [c.text for o in outs for c in o.outputs]
    assert len(texts) == 10 * scale
    for o in outs:
        for c in o.outputs:
            assert c.finish_reason == "stop", (o.prompt, c.text)
            jsonschema.validate(json.loads(c.text), PERSON)
    assert len(set(texts[4 * scale :])) > 1, "sampled outputs should differ across seeds"
    return outs


def _texts(outs) -> list[list[str]]:
    return [[c.text for c in o.outputs] for o in outs]


def _ids(outs) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


def _mode_requests():
    """Constrained requests whose tokens must not depend on the decoding mode."""
    prompts = PROMPTS[:4] + ["Code:", "Answer:"]
    regex = GuidedDecodingParams(regex=REGEX)
    choice = GuidedDecodingParams(choice=CHOICES)
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD)] * 2
    params += [
        SamplingParams(temperature=1.0, seed=5, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD)
    ] * 2
    params += [
        SamplingParams(temperature=0, max_tokens=20, guided_decoding=regex),
        SamplingParams(temperature=0, max_tokens=20, guided_decoding=choice),
    ]
    return prompts, params


def _hold_back(llm) -> None:
    """A request whose grammar is still compiling is not scheduled; others run meanwhile."""
    eng = llm.llm_engine
    pending: Future = Future()
    real = eng.guided.grammar_future
    gd = GuidedDecodingParams(regex=REGEX)
    eng.guided.grammar_future = lambda p: pending if p.guided_decoding is gd else real(p)
    try:
        eng.add_request("plain", "Hello", SamplingParams(temperature=0, max_tokens=4))
        eng.add_request(
            "held", "Hello", SamplingParams(temperature=0, max_tokens=20, guided_decoding=gd)
        )
        seen: dict = {}
        while "plain" not in seen or not seen["plain"].finished:
            for out in eng.step():
                seen[out.request_id] = out
        assert len(seen["plain"].outputs[0].token_ids) == 4
        assert "held" not in seen and eng.get_num_unfinished_requests() == 1
        pending.set_result(real(SamplingParams(guided_decoding=gd)).result())
        while eng.has_unfinished_requests():
            for out in eng.step():
                seen[out.request_id] = out
        assert re.fullmatch(REGEX, seen["held"].outputs[0].text), seen["held"].outputs[0].text
    finally:
        del eng.guided.grammar_future


# a schema that parses and compiles but that no value matches (a reference cycle)
NEVER = {"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [{"$ref": "#/$defs/n"}]}}}

BAD = [
    (dict(json={"type": "foo"}), r"invalid guided json: .*foo"),
    (dict(json=NEVER), r"invalid guided json: could not compile it .*can never be satisfied"),
    (dict(json="{not json"), r"invalid guided json"),
    (dict(json={"type": "object", "properties": {"a": {"type": "nope"}}}), r"nope"),
    (dict(regex="a(b"), r"invalid guided regex: .*parenthesis"),
    (dict(regex="(?<=a)b"), r"invalid guided regex: .*Lookbehind is not supported"),
    (dict(grammar="root ::= "), r"invalid guided grammar"),
    (dict(grammar='start ::= "a"'), r"invalid guided grammar"),
]

BAD_PARAMS = [
    (dict(), r"exactly one of json, regex, choice, grammar, json_object; got none"),
    (dict(regex="a", choice=["a"]), r"exactly one .* got \['regex', 'choice'\]"),
    (dict(choice=[]), r"guided choice must be a non-empty list"),
    (dict(choice=["a", ""]), r"guided choice must be a non-empty list"),
    (dict(json=3), r"guided json must be a JSON schema"),
    (
        dict(regex="a", backend="outlines"),
        r"backend must be one of \['auto', 'xgrammar'\].*'outlines'",
    ),
]


@pytest.mark.parametrize("kwargs,match", BAD_PARAMS)
def test_bad_guided_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GuidedDecodingParams(**kwargs)
    with pytest.raises(ValueError, match="guided_decoding must be a GuidedDecodingParams"):
        SamplingParams(guided_decoding={"json": {}})


def test_missing_xgrammar_is_named(monkeypatch):
    """Without xgrammar a constraint fails with the package to install (pinned as in the
    requirement files), not a bare ModuleNotFoundError."""
    import pathlib

    from vllm.model_executor.guided_decoding import compiler

    root = pathlib.Path(__file__).resolve().parents[2]
    for req in ("requirements-cpu.txt", "requirements-cuda.txt"):
        pins = (root / req).read_text().replace(" ", "")
        assert compiler.XGRAMMAR_REQUIREMENT in pins, req
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # makes `import xgrammar` fail
    with pytest.raises(ImportError, match=r"need the xgrammar package.*pip install --no-deps "
                       r"xgrammar==0\.2\.9 apache-tvm-ffi"):  # fmt: skip
        compiler.parse_grammar(GuidedDecodingParams(regex="[a-z]+"))


def _bad_inputs(llm, prompt: str, before: str) -> None:
    for kwargs, match in BAD:
        params = SamplingParams(max_tokens=4, guided_decoding=GuidedDecodingParams(**kwargs))
        with pytest.raises(ValueError, match=match):
            llm.generate([prompt], params, use_tqdm=False)
        assert llm.llm_engine.get_num_unfinished_requests() == 0
    again = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert again[0].outputs[0].text == before


@pytest.mark.forked
def test_tiny_model_constraints_and_decoding_modes(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, max_model_len=512, seed=0)
    base = llm.generate(PLAIN_PROMPTS, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    _check_json_outputs(llm, scale=5)  # 50 outputs
    # regex and choice hold for every output (n=3 seeded sampling too)
    regex = SamplingParams(
        temperature=1.0,
        seed=1,
        n=3,
        max_tokens=20,
        guided_decoding=GuidedDecodingParams(regex=REGEX),
    )
    choice = SamplingParams(
        temperature=1.0,
        seed=2,
        n=3,
        max_tokens=20,
        guided_decoding=GuidedDecodingParams(choice=CHOICES),
    )
    outs = llm.generate(PROMPTS[:6], [regex, choice] * 3, use_tqdm=False)
    for o, p in zip(outs, [regex, choice] * 3):
        for c in o.outputs:
            ok = re.fullmatch(REGEX, c.text) if p is regex else c.text in CHOICES
            assert ok and c.finish_reason == "stop", c.text
    # a stop string ends a constrained output early
    stop = SamplingParams(
        temperature=0, max_tokens=20, stop=["-"], guided_decoding=GuidedDecodingParams(regex=REGEX)
    )
    out = llm.generate(["Code:"], stop, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and re.fullmatch("[a-z]{3}", out.text), out.text
    # upstream's spelling, SamplingParams(structured_outputs=...): the same greedy output
    spellings = [
        SamplingParams(temperature=0, max_tokens=20, structured_outputs=so)
        for so in (StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(choice=CHOICES))
    ] + [
        SamplingParams(temperature=0, max_tokens=20, guided_decoding=gd)
        for gd in (GuidedDecodingParams(regex=REGEX), GuidedDecodingParams(choice=CHOICES))
    ]
    texts = [o.outputs[0].text for o in llm.generate(["Code:"] * 4, spellings, use_tqdm=False)]
    assert re.fullmatch(REGEX, texts[0]) and texts[1] in CHOICES and texts[:2] == texts[2:]
    # mixed batch: unconstrained outputs (greedy and seeded) equal those of a run without
    # the constrained requests; a seeded constrained output is the same alone and batched
    plain = [
        SamplingParams(temperature=0, max_tokens=12),
        SamplingParams(temperature=1.0, seed=9, max_tokens=12),
    ]
    seeded_json = SamplingParams(
        temperature=1.0, seed=3, max_tokens=MAX_TOKENS, guided_decoding=JSON_GD
    )
    alone = llm.generate(PLAIN_PROMPTS[:2], plain, use_tqdm=False)
    json_alone = llm.generate(PROMPTS[:1], seeded_json, use_tqdm=False)
    mixed = llm.generate(
        PLAIN_PROMPTS[:2] + PROMPTS[:3], plain + [seeded_json, regex, choice], use_tqdm=False
    )
    assert _ids(mixed[:2]) == _ids(alone)
    assert _ids(mixed[2:3]) == _ids(json_alone)
    _hold_back(llm)
    _bad_inputs(llm, PLAIN_PROMPTS[0], base[0].outputs[0].text)
    prompts, params = _mode_requests()
    ref = _ids(llm.generate(prompts, params, use_tqdm=False))
    llm.llm_engine.shutdown()
    del llm

    # multi-step: steps with a constrained row run one pass; same tokens
    llm = LLM(tiny_llama_dir, max_model_len=512, seed=0, num_scheduler_steps=4)
    assert _ids(llm.generate(prompts, params, use_tqdm=False)) == ref
    llm.llm_engine.shutdown()
    del llm

    # n-gram speculation: proposals for unconstrained rows, none for constrained steps
    llm = LLM(
        tiny_llama_dir,
        max_model_len=512,
        seed=0,
        speculative_model="[ngram]",
        num_speculative_tokens=3,
        ngram_prompt_lookup_max=3,
    )
    # (a random model seldom continues a prompt's spans; its own repeats give proposals)
    llm.generate(NGRAM_PROMPTS, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    drafts = llm.llm_engine.spec_decode_metrics()["num_draft_tokens"]
    assert drafts > 0
    assert _ids(llm.generate(prompts, params, use_tqdm=False)) == ref
    assert llm.llm_engine.spec_decode_metrics()["num_draft_tokens"] == drafts
    llm.llm_engine.shutdown()
    del llm

    # PP=2: the bitmask travels with the step's metadata to the last stage
    llm = LLM(tiny_llama_dir, max_model_len=512, seed=0, pipeline_parallel_size=2)
    assert _ids(llm.generate(prompts, params, use_tqdm=False)) == ref
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_min_tokens_with_a_constraint(tiny_llama_dir):
    """min_tokens masks the end of sequence while the grammar allows anything else (the
    regex's optional digits are all taken), and yields to a grammar that allows only its
    end (a choice ends as without min_tokens)."""
    llm = LLM(tiny_llama_dir, max_model_len=512, seed=0)
    regex = GuidedDecodingParams(regex=REGEX)
    choice = GuidedDecodingParams(choice=CHOICES)
    params = [
        SamplingParams(temperature=0, max_tokens=40, min_tokens=30, guided_decoding=regex),
        SamplingParams(temperature=0, max_tokens=20, min_tokens=15, guided_decoding=choice),
        SamplingParams(temperature=0, max_tokens=20, guided_decoding=choice),
    ]
    outs = [o.outputs[0] for o in llm.generate(["Code:"] * 3, params, use_tqdm=False)]
    assert re.fullmatch(r"[a-z]{3}-[0-9]{4}", outs[0].text), outs[0].text
    assert outs[0].finish_reason == "stop" and len(outs[0].token_ids) < 30
    assert outs[1].text in CHOICES and outs[1].finish_reason == "stop"
    assert outs[1].token_ids == outs[2].token_ids
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_smollm2_json_schema(smollm2_gguf):
    llm = LLM(smollm2_gguf, max_model_len=512, seed=0)
    # 20 outputs: greedy, seeded and n=2 requests on the real weights; the 50-output batch
    # runs on the tiny model (test_tiny_model_constraints_and_decoding_modes)
    _check_json_outputs(llm, scale=2)
    obj = SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, guided_decoding=GuidedDecodingParams(json_object=True)
    )
    out = llm.generate(["Give a JSON object describing Paris:"], obj, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict)
    llm.llm_engine.shutdown()
