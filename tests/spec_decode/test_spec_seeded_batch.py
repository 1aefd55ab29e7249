"""A seeded request's tokens under n-gram speculation do not depend on its batch: batched
with a greedy request whose repeats get proposals, a seeded request that gets none emits
what it emits alone without speculation. Guards: the rejection sampler drew k uniforms
from every seeded row's generator whenever any row of the step had proposals, so the
seeded row's later tokens changed with its neighbours."""

import random

import pytest

from vllm import LLM, SamplingParams

SPEC = dict(speculative_model="[ngram]", num_speculative_tokens=3, ngram_prompt_lookup_max=3)


def _prompts() -> tuple[list[int], list[int]]:
    """Two random-id prompts sharing a 70-token head; the tiny model's greedy continuation
    of the second repeats itself, so the n-gram proposer proposes for it, while the
    seeded continuation of the first gets no proposals."""
    r = random.Random(0)
    head = [r.randrange(3, 49000) for _ in range(70)]
    out = []
    for i in range(3):
        ids = [r.randrange(3, 49000) for _ in range(r.randint(5, 200))]
        if i % 2 == 0:
            ids = head + ids[: r.randint(1, 60)]
        if i % 3 == 1:
            span = [r.randrange(3, 49000) for _ in range(8)]
            ids = ids[:30] + span + ids[30:60] + span + span[:4]
        out.append(ids)
    return out[0], out[2]


@pytest.mark.forked
def test_seeded_tokens_do_not_depend_on_the_batch(tiny_llama_dir):
    a, b = _prompts()
    seeded = SamplingParams(temperature=1.0, seed=123, max_tokens=48)
    greedy = SamplingParams(temperature=0, max_tokens=48)
    items = [{"prompt_token_ids": a}, {"prompt_token_ids": b}]
    plain = LLM(tiny_llama_dir, device="cpu", seed=0)
    alone = plain.generate(items[:1], seeded, use_tqdm=False)[0].outputs[0].token_ids
    plain.llm_engine.shutdown()
    del plain
    spec = LLM(tiny_llama_dir, device="cpu", seed=0, **SPEC)
    outs = spec.generate(items, [seeded, greedy], use_tqdm=False)
    assert spec.llm_engine.spec_decode_metrics()["num_draft_tokens"] > 0  # the path ran
    assert len(set(alone)) >= 10, alone
    assert list(outs[0].outputs[0].token_ids) == list(alone)
