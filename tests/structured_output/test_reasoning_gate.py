"""A constraint that waits for the reasoning to end (``reasoning_token_ids``, what a server
with ``--reasoning-parser`` sets): on the tiny model whose greedy chat reply generates
``</think>`` at position ``end_at`` (tests/conftest.py ``tiny_think_dir``), the greedy
tokens up to and including ``</think>`` equal the unconstrained run's and the text after
it is JSON valid against the schema; without the tag ids the same constraint holds from
the first token (as before); a prompt that already closed the reasoning is constrained
from the first token; the gated tokens are the same with multi-step decoding, and with
chunked prefill, prefix caching and preemption by recompute together.

Each engine starts once and serves every request of its part."""

import json
import os

import jsonschema
import pytest

from tests.structured_output.schemas import MAX_TOKENS, PERSON
from vllm import LLM, SamplingParams
from vllm.sampling_params import GuidedDecodingParams


def _setup(think_dir):
    from transformers import AutoTokenizer

    with open(os.path.join(think_dir, "think.json")) as f:
        meta = json.load(f)
    tok = AutoTokenizer.from_pretrained(think_dir)
    tags = tuple(tok.convert_tokens_to_ids(["<think>", "</think>"]))
    return tok, tags, meta["prompt_ids"], meta["end_at"]


def _params(tags=None, max_tokens=MAX_TOKENS):
    gd = GuidedDecodingParams(json=PERSON, disable_any_whitespace=True, reasoning_token_ids=tags)
    return SamplingParams(temperature=0, max_tokens=max_tokens, guided_decoding=gd)


def _valid_json(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


def _ids(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def test_reasoning_ended_is_upstreams_rule():
    """The last reasoning tag decides: the end tag ends it, a later start tag reopens it;
    no tag: not ended; no tag ids: nothing to wait for."""
    gd = GuidedDecodingParams(regex="a", reasoning_token_ids=[7, 8])
    assert gd.reasoning_token_ids == (7, 8)
    assert gd.reasoning_ended([1, 7, 2, 8, 3])
    assert not gd.reasoning_ended([1, 8, 2, 7, 3])
    assert not gd.reasoning_ended([1, 2, 3]) and not gd.reasoning_ended([])
    assert GuidedDecodingParams(regex="a").reasoning_ended([7])
    assert gd.key() == GuidedDecodingParams(regex="a").key()  # one compiled grammar
    with pytest.raises(ValueError, match="reasoning_token_ids must be the"):
        GuidedDecodingParams(regex="a", reasoning_token_ids=(7,))


@pytest.mark.forked
def test_grammar_starts_after_the_reasoning(tiny_think_dir):
    tok, tags, prompt, end_at = _setup(tiny_think_dir)
    llm = LLM(tiny_think_dir, device="cpu", dtype="float32", max_model_len=512, seed=0)
    source = {"prompt_token_ids": prompt}
    free = llm.generate(source, SamplingParams(temperature=0, max_tokens=end_at + 8),
                        use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert free.token_ids[end_at] == tags[1] and tags[1] not in free.token_ids[:end_at]
    assert len(set(free.token_ids[:end_at])) >= 3  # a reasoning part that is not one token

    gated, plain = llm.generate([source] * 2, [_params(tags), _params()], use_tqdm=False)
    gated, plain = gated.outputs[0], plain.outputs[0]
    # the reasoning is the unconstrained run's, the grammar holds after </think>
    assert list(gated.token_ids[: end_at + 1]) == list(free.token_ids[: end_at + 1])
    reasoning, _, content = gated.text.partition("</think>")
    assert reasoning == tok.decode(free.token_ids[:end_at])
    _valid_json(content)
    assert gated.finish_reason == "stop"
    # without tag ids (a request without a reasoning parser, or enable_in_reasoning):
    # constrained from the first token, as before
    _valid_json(plain.text)
    assert plain.token_ids[0] != free.token_ids[0]

    # a prompt whose chat template closed the reasoning (Qwen3 with enable_thinking
    # false): constrained from the first token, the same tokens as without tag ids
    closed = {"prompt_token_ids": prompt + tok.encode("<think>\n\n</think>\n\n")}
    reopened = {"prompt_token_ids": closed["prompt_token_ids"] + [tags[0]]}
    outs = llm.generate([closed, closed, reopened], [_params(tags), _params(), _params(tags)],
                        use_tqdm=False)  # fmt: skip
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    _valid_json(outs[0].outputs[0].text)
    assert "</think>" not in outs[0].outputs[0].text
    with pytest.raises(json.JSONDecodeError):  # a later <think> reopens it: unconstrained
        json.loads(outs[2].outputs[0].text)

    # a mixed batch: each request as alone
    unconstrained = SamplingParams(temperature=0, max_tokens=end_at + 8)
    mixed = llm.generate([source] * 3, [_params(tags), unconstrained, _params()], use_tqdm=False)
    assert _ids(mixed) == [list(gated.token_ids), list(free.token_ids), list(plain.token_ids)]
    llm.llm_engine.shutdown()
    del llm

    # multi-step: a reasoning row makes its step run one pass, so </think> is the last
    # unconstrained token (no row constrained from the start here to force that); the
    # same tokens
    llm = LLM(tiny_think_dir, device="cpu", dtype="float32", max_model_len=512, seed=0,
              num_scheduler_steps=4)  # fmt: skip
    outs = llm.generate([source] * 2, [_params(tags), unconstrained], use_tqdm=False)
    assert _ids(outs) == _ids(mixed[:2])
    llm.llm_engine.shutdown()
    del llm

    # chunked prefill (16-token chunks), prefix caching (the same prompt four times) and
    # preemption by recompute (12 blocks of 16 cannot hold four ~140-token sequences)
    llm = LLM(tiny_think_dir, device="cpu", dtype="float32", max_model_len=192, seed=0,
              enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=4,
              enable_prefix_caching=True, block_size=16, num_gpu_blocks_override=12)  # fmt: skip
    outs = llm.generate([source] * 4, [_params(tags)] * 4, use_tqdm=False)
    assert sum(s.num_cumulative_preemption for s in llm.llm_engine.schedulers) > 0
    assert _ids(outs) == [list(gated.token_ids)] * 4
    llm.llm_engine.shutdown()
