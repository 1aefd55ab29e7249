"""Scoring with an embedding model: the pairing rules and the cosine (no engine), and
``LLM.score`` on CPU float32, whose scores equal the cosine similarity of transformers'
pooled hidden states on the same weights for 1-to-1, 1-to-N and N-to-N pairs; what it
refuses is refused before anything is queued."""

import gc

import pytest
import torch

from tests.pooling.hf_reference import cosine, hf_embeddings, hf_token_ids

TEXTS = ["What is the capital of France?", "The capital of France is Paris.",
         "Horses and cows are both animals.", "The capital of Brazil is Brasilia."]  # fmt: skip


def test_pairing_rules():
    from vllm.pooling.scoring import PairingError, check_pairs

    assert check_pairs(["q"], ["a"]) == 1  # 1-to-1
    assert check_pairs(["q"], ["a", "b", "c"]) == 3  # 1-to-N
    assert check_pairs(["q", "r"], ["a", "b"]) == 2  # N-to-N
    cases = [
        (([], ["a"]), "text_1", r"text_1 must hold at least one text, got an empty list"),
        ((["q"], []), "text_2", r"text_2 must hold at least one text, got an empty list"),
        ((["q", "r"], ["a", "b", "c"]), "text_1",
         r"text_1 has 2 texts and text_2 has 3: pairs are 1-to-1, 1-to-N"),
        ((["q", "r", "s"], ["a"]), "text_1", r"text_1 has 3 texts and text_2 has 1"),
    ]  # fmt: skip
    for (first, second), param, match in cases:
        with pytest.raises(PairingError, match=match) as e:
            check_pairs(first, second)
        assert e.value.param == param
    with pytest.raises(PairingError, match="documents must hold at least one") as e:
        check_pairs(["q"], [], ("query", "documents"))
    assert e.value.param == "documents"


def test_cosine_scores_broadcast_one_first_vector():
    from vllm.pooling.scoring import cosine_scores

    g = torch.Generator().manual_seed(0)
    q, a, b, c = (torch.randn(8, generator=g) for _ in range(4))
    got = cosine_scores([q], [a, b, 2 * q])  # 1-to-N: q against each
    assert got == pytest.approx([cosine(q, a), cosine(q, b), 1.0], abs=1e-6)
    got = cosine_scores([q, a], [b, -a])  # N-to-N: zip
    assert got == pytest.approx([cosine(q, b), -1.0], abs=1e-6)
    assert cosine_scores([c.half()], [c.half()]) == pytest.approx([1.0], abs=1e-6)


@pytest.mark.forked
def test_llm_score_equals_transformers_cosine(tiny_llama_dir):
    from vllm import LLM, ScoringRequestOutput

    ids = hf_token_ids(tiny_llama_dir, TEXTS)
    ref = hf_embeddings(tiny_llama_dir, ids)
    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", task="embed",
              max_model_len=128)  # fmt: skip
    for first, second in [([0], [1]), ([0], [1, 2, 3]), ([0, 2, 3], [1, 1, 0])]:
        text_1 = TEXTS[first[0]] if len(first) == 1 else [TEXTS[i] for i in first]
        text_2 = TEXTS[second[0]] if len(second) == 1 else [TEXTS[i] for i in second]
        outs = llm.score(text_1, text_2, use_tqdm=False)
        pairs = [(first[0] if len(first) == 1 else first[k], j) for k, j in enumerate(second)]
        assert len(outs) == len(pairs)
        for out, (i, j) in zip(outs, pairs):
            assert isinstance(out, ScoringRequestOutput) and out.finished
            assert out.outputs.score == pytest.approx(cosine(ref[i], ref[j]), abs=1e-5), (i, j)
            assert out.prompt_token_ids == ids[i] + ids[j]
    scores = [o.outputs.score for o in llm.score(TEXTS[0], TEXTS[1:], use_tqdm=False)]
    assert max(scores) - min(scores) > 1e-3  # the texts' scores differ: the check can fail
    # token-id prompts and truncate_prompt_tokens, as LLM.encode takes them
    (cut,) = llm.score({"prompt_token_ids": ids[0]}, {"prompt_token_ids": ids[1]},
                       truncate_prompt_tokens=3, use_tqdm=False)  # fmt: skip
    short = hf_embeddings(tiny_llama_dir, [ids[0][-3:], ids[1][-3:]])
    assert cut.outputs.score == pytest.approx(cosine(*short), abs=1e-5)
    assert cut.prompt_token_ids == ids[0][-3:] + ids[1][-3:]
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.mark.forked
def test_llm_score_refusals(tiny_llama_dir):
    from vllm import LLM

    llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", task="embed",
              max_model_len=128)  # fmt: skip
    for args, match in [
        (([], TEXTS[:1]), "text_1 must hold at least one text"),
        ((TEXTS[:2], TEXTS[:3]), "text_1 has 2 texts and text_2 has 3"),
        ((TEXTS[0], [list(range(1, 200))]), "longer than max_model_len=128"),
    ]:
        with pytest.raises(ValueError, match=match):
            llm.score(*args)
        assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="LLM.classify is not supported"):
        llm.classify(TEXTS[0])
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    gen = LLM(model=tiny_llama_dir, device="cpu", max_model_len=128)
    with pytest.raises(ValueError, match=r"needs an embedding engine .* cross-encoder models"):
        gen.score(TEXTS[0], TEXTS[1])
    gen.llm_engine.shutdown()
