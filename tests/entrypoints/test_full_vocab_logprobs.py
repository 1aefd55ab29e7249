"""``logprobs=-1`` / ``prompt_logprobs=-1`` (upstream: every token of the vocabulary) on the
tiny Llama (CPU): each position's dict holds vocab_size entries whose top ones equal a
top-5 request's; ``max_logprobs=-1`` lifts the limit, the default of 20 refuses -1.

Guards: SamplingParams refused -1 ("must be >= 0")."""

import math

import pytest

PROMPT = {"prompt_token_ids": [1, 300, 41, 7, 22]}


@pytest.mark.forked
def test_minus_one_returns_the_whole_vocabulary(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64, max_logprobs=-1)
    assert llm.llm_engine.model_config.max_logprobs == -1
    vocab = llm.llm_engine.model_config.vocab_size
    base = dict(temperature=0.0, max_tokens=3, ignore_eos=True)
    full = llm.generate(PROMPT, SamplingParams(**base, logprobs=-1, prompt_logprobs=-1),
                        use_tqdm=False)[0]  # fmt: skip
    top = llm.generate(PROMPT, SamplingParams(**base, logprobs=5, prompt_logprobs=5),
                       use_tqdm=False)[0]  # fmt: skip
    assert full.outputs[0].token_ids == top.outputs[0].token_ids
    out_full, out_top = full.outputs[0].logprobs, top.outputs[0].logprobs
    assert len(out_full) == 3 and [len(p) for p in out_full] == [vocab] * 3
    assert full.prompt_logprobs[0] is None and top.prompt_logprobs[0] is None
    assert [len(p) for p in full.prompt_logprobs[1:]] == [vocab] * (
        len(PROMPT["prompt_token_ids"]) - 1
    )
    for f, t in [*zip(out_full, out_top), *zip(full.prompt_logprobs[1:], top.prompt_logprobs[1:])]:
        assert sorted(lp.rank for lp in f.values()) == list(range(1, vocab + 1))
        for tok, lp in t.items():  # the top-5 (and the chosen token) as a normal request
            assert f[tok].rank == lp.rank
            assert f[tok].logprob == pytest.approx(lp.logprob, abs=1e-5)
        probs = sum(math.exp(lp.logprob) for lp in f.values())
        assert probs == pytest.approx(1.0, abs=1e-3)  # every token: a distribution


@pytest.mark.forked
def test_minus_one_is_checked_against_max_logprobs(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=64)  # max_logprobs=20
    vocab = llm.llm_engine.model_config.vocab_size
    for name in ("logprobs", "prompt_logprobs"):
        want = rf"{name}=-1 asks for the full vocabulary \({vocab}\), more than max_logprobs=20"
        with pytest.raises(ValueError, match=want):
            llm.generate(PROMPT, SamplingParams(**{name: -1}), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="logprobs must be >= 0, or -1 for the full vocabulary"):
        SamplingParams(logprobs=-2)
    # a limit at least the vocabulary size allows -1 too
    llm.llm_engine.model_config.max_logprobs = vocab
    out = llm.generate(PROMPT, SamplingParams(max_tokens=1, logprobs=-1), use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs[0]) == vocab


@pytest.mark.forked
def test_server_shows_the_whole_vocabulary_for_minus_one(tiny_llama_dir):
    """`vllm serve --max-logprobs -1`: completions ``logprobs=-1`` (with ``echo``, so the
    prompt's positions too), ``prompt_logprobs=-1`` and chat ``top_logprobs=-1`` list every
    vocabulary token at each position (tokens as ``token_id:ID``, so no two share a key)."""
    import httpx

    from tests.utils import RemoteOpenAIServer

    vocab = 49152  # the tiny models' SmolLM2 tokenizer
    srv = RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", "--max-logprobs", "-1"])
    name = tiny_llama_dir.rstrip("/").rsplit("/", 1)[-1]
    ids = [300, 41, 7]
    try:
        body = {"model": name, "prompt": ids, "max_tokens": 1, "temperature": 0,
                "logprobs": -1, "echo": True, "prompt_logprobs": -1,
                "return_tokens_as_token_ids": True}  # fmt: skip
        r = httpx.post(srv.url_for("v1", "completions"), json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        tops = choice["logprobs"]["top_logprobs"]
        assert tops[0] is None and [len(t) for t in tops[1:]] == [vocab] * 3
        assert [len(p) for p in choice["prompt_logprobs"][1:]] == [vocab] * 2
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1, "logprobs": True, "top_logprobs": -1}  # fmt: skip
        r = httpx.post(srv.url_for("v1", "chat", "completions"), json=chat, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == vocab
    finally:
        srv.stop()
