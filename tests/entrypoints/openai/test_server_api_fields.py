"""`vllm serve` (SmolLM2 on CPU, one server for the module) with upstream's request fields
and server flags: prompt_logprobs returned in each choice (equal to LLM.generate's),
bad_words, truncate_prompt_tokens (completions and chat), return_tokens_as_token_ids,
return_token_ids (completions and chat, streamed or not),
stream_options.continuous_usage_stats, use_beam_search (equal to LLM.beam_search), the
400s for suffix and stream_options without stream, the field an error's ``param`` names,
CORS (--allowed-origins) and --root-path; the server runs --scheduling-policy priority,
whose per-request ``priority`` leaves the greedy output unchanged.

Guards: prompt_logprobs computed but dropped from the response; bad_words,
truncate_prompt_tokens, return_tokens_as_token_ids, return_token_ids and
continuous_usage_stats accepted and ignored; guided_regex errors naming response_format;
stop_token_ids errors naming stop.
"""

import json

import httpx
import pytest

from tests.utils import RemoteOpenAIServer, run_in_fork

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts and its reference engine runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_server_api_fields")

MODEL = "smollm2"
ALIAS = "smol-alias"  # a second served name
MAX_LEN = 512
ORIGIN = "http://good.example"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    args = ["--device", "cpu", "--max-model-len", str(MAX_LEN), "--served-model-name", MODEL]
    args += [ALIAS]
    args += ["--allowed-origins", json.dumps([ORIGIN]), "--root-path", "/api"]
    args += ["--scheduling-policy", "priority"]  # every test here runs under it
    # processed logprobs show a masked token's -inf (test_masked_tokens_show_the_lowest_logprob);
    # greedy rows without edits and prompt logprobs report the same as the default's
    args += ["--logprobs-mode", "processed_logprobs"]
    srv = RemoteOpenAIServer(smollm2_gguf, args)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """LLM.generate's prompt logprobs and greedy ids, computed in a forked child."""

    def run():
        from vllm import LLM, SamplingParams

        llm = LLM(smollm2_gguf, device="cpu", max_model_len=MAX_LEN)
        sp = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=1)
        out = llm.generate(PROMPT, sp, use_tqdm=False)[0]
        plp = [
            None if pos is None else {str(t): [lp.logprob, lp.rank] for t, lp in pos.items()}
            for pos in out.prompt_logprobs
        ]
        from vllm import BeamSearchParams

        beams = llm.beam_search(PROMPT, BeamSearchParams(beam_width=3, max_tokens=5))[0]
        beam = [(s.text, s.finish_reason, s.cum_logprob) for s in beams.sequences]
        return {"prompt_ids": list(out.prompt_token_ids), "prompt_logprobs": plp, "beam": beam}

    return run_in_fork(run)


def _post(server, path, body, **kw):
    return httpx.post(server.url_for("v1", path), json={"model": MODEL, **body}, timeout=120, **kw)


def _ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _bad(r: httpx.Response, param: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err


def test_prompt_logprobs_equal_llm_generate(server, reference):
    body = dict(prompt=PROMPT, max_tokens=3, temperature=0, prompt_logprobs=1)
    choice = _ok(_post(server, "completions", body))["choices"][0]
    got = choice["prompt_logprobs"]
    ids = reference["prompt_ids"]
    assert len(got) == len(ids) and got[0] is None
    tok = _tokenizer(server)
    for i, (pos, want) in enumerate(zip(got[1:], reference["prompt_logprobs"][1:]), 1):
        assert str(ids[i]) in pos  # the prompt token itself, plus the top-1
        assert set(pos) == set(want), (i, pos, want)
        for t, entry in pos.items():
            assert entry["logprob"] == pytest.approx(want[t][0], abs=1e-4)
            assert entry["rank"] == want[t][1]
            assert entry["decoded_token"] == tok[int(t)]
    assert choice["logprobs"] is None


def _tokenizer(server) -> dict[int, str]:
    """Token id -> text via the server's /detokenize (only the ids asked for)."""

    class Lazy(dict):
        def __missing__(self, token_id):
            r = httpx.post(
                server.url_for("detokenize"), json={"model": MODEL, "tokens": [token_id]}
            )
            self[token_id] = _ok(r)["prompt"]
            return self[token_id]

    return Lazy()


def test_bad_words_ban_single_and_multi_token_words(server):
    base = dict(prompt=PROMPT, max_tokens=6, temperature=0)
    plain = _ok(_post(server, "completions", base))["choices"][0]["text"]
    assert plain.startswith(" Paris")
    banned = _ok(_post(server, "completions", {**base, "bad_words": ["Paris"]}))
    text = banned["choices"][0]["text"]
    assert "Paris" not in text and text != plain
    chat = dict(messages=[{"role": "user", "content": "What is the capital of France?"}])
    chat.update(max_tokens=8, temperature=0)
    before = _ok(_post(server, "chat/completions", chat))["choices"][0]["message"]["content"]
    assert "Paris" in before
    after = _post(server, "chat/completions", {**chat, "bad_words": ["Paris"]})
    assert "Paris" not in _ok(after)["choices"][0]["message"]["content"]
    _bad(_post(server, "completions", {**base, "bad_words": [" "]}), "bad_words", "bad_words")


def test_truncate_prompt_tokens_keeps_the_last_k(server, reference):
    ids = reference["prompt_ids"]
    long_prompt = [1000 + (i % 500) for i in range(9001 - len(ids))] + ids
    assert len(long_prompt) == 9001
    body = dict(max_tokens=3, temperature=0)
    whole = _ok(_post(server, "completions", {**body, "prompt": ids}))
    cut = _ok(
        _post(
            server,
            "completions",
            {**body, "prompt": long_prompt, "truncate_prompt_tokens": len(ids)},
        )
    )
    assert cut["usage"]["prompt_tokens"] == len(ids)
    assert cut["choices"][0]["text"] == whole["choices"][0]["text"]
    text = _ok(
        _post(
            server, "completions", {**body, "prompt": "word " * 9001, "truncate_prompt_tokens": 7}
        )
    )
    assert text["usage"]["prompt_tokens"] == 7
    for k in (0, -2):
        r = _post(server, "completions", {**body, "prompt": ids, "truncate_prompt_tokens": k})
        _bad(r, "truncate_prompt_tokens", str(k))
    r = _post(server, "completions", {**body, "prompt": ids, "truncate_prompt_tokens": 9001})
    _bad(r, "truncate_prompt_tokens", "9001", str(MAX_LEN))


def test_chat_truncate_prompt_tokens_keeps_the_last_k(server):
    """Chat takes truncate_prompt_tokens as completions do: the rendered prompt's last k
    tokens, so a conversation longer than the context is served, and the reply equals a
    completion of those k token ids."""
    msgs = [{"role": "user", "content": "word " * 2000 + "What is the capital of France?"}]
    rendered = _ok(httpx.post(server.url_for("tokenize"), json={"model": MODEL, "messages": msgs}))
    ids = rendered["tokens"]
    assert len(ids) > MAX_LEN
    body = dict(max_tokens=3, temperature=0)
    chat = _ok(
        _post(server, "chat/completions", {**body, "messages": msgs, "truncate_prompt_tokens": 20})
    )
    assert chat["usage"]["prompt_tokens"] == 20
    want = _ok(_post(server, "completions", {**body, "prompt": ids[-20:]}))
    assert chat["choices"][0]["message"]["content"] == want["choices"][0]["text"]
    r = _post(server, "chat/completions", {**body, "messages": msgs, "truncate_prompt_tokens": 0})
    _bad(r, "truncate_prompt_tokens", "0")
    r = _post(server, "chat/completions", {**body, "messages": msgs})
    _bad(r, "messages", str(MAX_LEN))


def test_return_tokens_as_token_ids(server):
    body = dict(prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True)
    body["return_tokens_as_token_ids"] = True
    lps = _ok(_post(server, "completions", body))["choices"][0]["logprobs"]
    ids = _ok(httpx.post(server.url_for("tokenize"), json={"model": MODEL, "prompt": PROMPT}))
    prompt_ids = ids["tokens"]
    assert lps["tokens"][: len(prompt_ids)] == [f"token_id:{t}" for t in prompt_ids]
    assert all(t.startswith("token_id:") for t in lps["tokens"])
    assert all(k.startswith("token_id:") for top in lps["top_logprobs"][1:] for k in top)


def _events(server, path, body) -> list[dict]:
    """The JSON chunks of a streamed request (without the final ``[DONE]``)."""
    with httpx.stream(
        "POST", server.url_for("v1", path), json={"model": MODEL, **body}, timeout=120
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_return_token_ids(server):
    """return_token_ids: the prompt's ids (as /tokenize gives them) and the generated ids
    (as return_tokens_as_token_ids names them in the logprobs); streamed, the prompt's ids
    come once, in the first chunk, and the chunks' ids join to the unstreamed ones; without
    the field neither key appears."""
    prompt_ids = _ok(
        httpx.post(server.url_for("tokenize"), json={"model": MODEL, "prompt": PROMPT})
    )["tokens"]
    body = dict(prompt=PROMPT, max_tokens=5, temperature=0, ignore_eos=True, logprobs=0)
    body["return_tokens_as_token_ids"] = True
    choice = _ok(_post(server, "completions", {**body, "return_token_ids": True}))["choices"][0]
    want = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
    assert choice["prompt_token_ids"] == prompt_ids and choice["token_ids"] == want
    assert len(want) == 5
    plain = _ok(_post(server, "completions", body))["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain
    stream = dict(body, stream=True, return_token_ids=True, logprobs=None)
    chunks = _events(server, "completions", stream)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == want

    msgs = [{"role": "user", "content": PROMPT}]
    chat_prompt = _ok(
        httpx.post(server.url_for("tokenize"), json={"model": MODEL, "messages": msgs})
    )["tokens"]
    chat = dict(messages=msgs, max_tokens=5, temperature=0, ignore_eos=True, logprobs=True)
    chat["return_tokens_as_token_ids"] = True
    resp = _ok(_post(server, "chat/completions", {**chat, "return_token_ids": True}))
    want = [int(e["token"].split(":")[1]) for e in resp["choices"][0]["logprobs"]["content"]]
    assert resp["prompt_token_ids"] == chat_prompt and resp["choices"][0]["token_ids"] == want
    plain = _ok(_post(server, "chat/completions", chat))
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    chunks = _events(server, "chat/completions",
                     dict(chat, stream=True, return_token_ids=True, logprobs=False))  # fmt: skip
    assert chunks[0]["prompt_token_ids"] == chat_prompt
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == want


def test_continuous_usage_stats_on_every_chunk(server):
    """Each chunk carries its choice's usage so far (as upstream); the last one all of it."""
    body = dict(prompt=PROMPT, max_tokens=4, temperature=0, stream=True, n=2, ignore_eos=True)
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with httpx.stream(
        "POST", server.url_for("v1", "completions"), json={"model": MODEL, **body}, timeout=120
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    token_chunks = [c for c in chunks if c["choices"]]
    assert len(token_chunks) == 8
    for index in (0, 1):
        mine = [c for c in token_chunks if c["choices"][0]["index"] == index]
        assert [c["usage"]["completion_tokens"] for c in mine] == [1, 2, 3, 4]
    prompt_tokens = token_chunks[0]["usage"]["prompt_tokens"]
    assert all(c["usage"]["total_tokens"] == prompt_tokens + c["usage"]["completion_tokens"]
               for c in chunks)  # fmt: skip
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_refused_fields_and_error_params(server):
    base = dict(prompt=PROMPT, max_tokens=2)
    _bad(_post(server, "completions", {**base, "suffix": "x"}), "suffix", "suffix is not")
    opts = {"stream_options": {"include_usage": True}}
    _bad(_post(server, "completions", {**base, **opts}), "stream_options", "stream")
    chat = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **opts)
    _bad(_post(server, "chat/completions", chat), "stream_options", "stream")
    r = _post(server, "completions", {**base, "prompt_logprobs": 1, "stream": True})
    _bad(r, "prompt_logprobs", "stream")
    _bad(_post(server, "completions", {**base, "guided_regex": "[0-9"}), "guided_regex")
    r = _post(server, "completions", {**base, "stop_token_ids": [999999999]})
    _bad(r, "stop_token_ids", "999999999")


def test_min_tokens_yields_to_a_completed_grammar(server):
    """min_tokens with a constraint that completes sooner (one-token choices): the
    grammar's end stops the reply (as upstream accepts the pair)."""
    body = dict(prompt=PROMPT, max_tokens=8, min_tokens=4, guided_choice=["a", "b"])
    choice = _ok(_post(server, "completions", body))["choices"][0]
    assert choice["text"] in ("a", "b") and choice["finish_reason"] == "stop", choice


def test_responses_output_text_logprobs_equal_chats(server):
    """/v1/responses with include message.output_text.logprobs and top_logprobs: one
    entry per output token with its alternatives, equal to chat's for the same request,
    streamed (on the output_text.delta events) or not."""
    msgs = [{"role": "user", "content": "Hi"}]
    chat = _ok(_post(server, "chat/completions", dict(messages=msgs, max_tokens=4,
                                                      temperature=0, logprobs=True,
                                                      top_logprobs=2)))  # fmt: skip
    want = chat["choices"][0]["logprobs"]["content"]
    body = dict(input=msgs, max_output_tokens=4, temperature=0, top_logprobs=2,
                include=["message.output_text.logprobs"])  # fmt: skip
    resp = _ok(_post(server, "responses", body))
    got = resp["output"][-1]["content"][0]["logprobs"]
    assert len(got) == resp["usage"]["output_tokens"] == 4
    assert [(e["token"], len(e["top_logprobs"])) for e in got] == [(w["token"], 2) for w in want]
    assert [e["logprob"] for e in got] == pytest.approx([w["logprob"] for w in want], abs=1e-4)
    with httpx.stream("POST", server.url_for("v1", "responses"), timeout=120,
                      json={"model": MODEL, **body, "stream": True}) as r:  # fmt: skip
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    streamed = [e for ev in events if ev["type"] == "response.output_text.delta"
                for e in ev["logprobs"]]  # fmt: skip
    assert [e["token"] for e in streamed] == [e["token"] for e in got]


def test_response_names_the_requested_model(server):
    """With several served names a response reports the one asked for (as upstream)."""
    for name in (MODEL, ALIAS):
        body = {"model": name, "prompt": PROMPT, "max_tokens": 2}
        r = httpx.post(server.url_for("v1", "completions"), json=body, timeout=120)
        assert _ok(r)["model"] == name
        body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        r = httpx.post(server.url_for("v1", "chat/completions"), json={**body, "stream": True},
                       timeout=120)  # fmt: skip
        chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        assert chunks and {c["model"] for c in chunks} == {name}


def test_priority_field(server):
    base = dict(prompt=PROMPT, max_tokens=4, temperature=0)
    plain = _ok(_post(server, "completions", base))["choices"][0]["text"]
    for prio in (-5, 7):
        assert (
            _ok(_post(server, "completions", {**base, "priority": prio}))["choices"][0]["text"]
            == plain
        )
    _bad(_post(server, "completions", {**base, "priority": "high"}), "priority")
    r = _post(server, "completions", {**base, "priority": 1, "use_beam_search": True, "n": 2})
    _bad(r, "priority", "use_beam_search")


def test_cors_and_root_path(server):
    url = server.url_for("v1", "completions")
    preflight = {"Access-Control-Request-Method": "POST"}
    ok = httpx.options(url, headers={"Origin": ORIGIN, **preflight})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(url, headers={"Origin": "http://evil.example", **preflight})
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers
    r = httpx.get(server.url_for("v1", "models"), headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    for path in ("api/v1/models", "v1/models"):
        assert _ok(httpx.get(server.url_for(path)))["data"][0]["id"] == MODEL


def test_chat_takes_the_same_fields(server):
    """prompt_logprobs (at the response's top level, equal to /v1/completions on the
    rendered prompt's ids), return_tokens_as_token_ids, continuous usage and the field
    named by a bad constraint work on chat as on completions."""
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = dict(messages=msgs, max_tokens=3, temperature=0)
    r = _ok(_post(server, "chat/completions", {**chat, "prompt_logprobs": 1}))
    rendered = _ok(httpx.post(server.url_for("tokenize"), json={"model": MODEL, "messages": msgs}))
    ids = rendered["tokens"]
    want = _ok(_post(server, "completions", dict(prompt=ids, max_tokens=1, prompt_logprobs=1)))
    want = want["choices"][0]["prompt_logprobs"]
    got = r["prompt_logprobs"]
    assert len(got) == len(ids) == r["usage"]["prompt_tokens"] and got[0] is None
    for pos, ref in zip(got[1:], want[1:]):
        assert set(pos) == set(ref)
        for t, entry in pos.items():
            assert entry["logprob"] == pytest.approx(ref[t]["logprob"], abs=1e-5)
    r = _post(server, "chat/completions", {**chat, "prompt_logprobs": 1, "stream": True})
    _bad(r, "prompt_logprobs", "stream")

    body = {**chat, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True}
    content = _ok(_post(server, "chat/completions", body))["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(c["token"].startswith("token_id:") for c in content)
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])

    body = {**chat, "stream": True, "n": 2, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with httpx.stream(
        "POST", server.url_for("v1", "chat", "completions"), json={"model": MODEL, **body},
        timeout=120,
    ) as resp:  # fmt: skip
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert all(c["usage"] is not None for c in chunks)
    for index in (0, 1):  # the role chunk, then one per token, each counting its choice
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert [c["usage"]["completion_tokens"] for c in mine] == [0, 1, 2, 3]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6

    _bad(_post(server, "chat/completions", {**chat, "guided_regex": "[0-9"}), "guided_regex")


def test_masked_tokens_show_the_lowest_logprob(server):
    """A token masked out (allowed_token_ids) has the processed logprob -inf (the server
    runs with --logprobs-mode processed_logprobs; the default raw logprobs are the model's
    own, finite), which JSON cannot carry: responses show -9999.0 as upstream does,
    streamed and not, on both endpoints."""
    base = dict(prompt=PROMPT, max_tokens=2, temperature=0, allowed_token_ids=[28])
    lps = _ok(_post(server, "completions", {**base, "logprobs": 2}))["choices"][0]["logprobs"]
    assert lps["token_logprobs"] == [0.0, 0.0]
    assert all(sorted(top.values()) == [-9999.0, 0.0] for top in lps["top_logprobs"])
    with httpx.stream(
        "POST", server.url_for("v1", "completions"),
        json={"model": MODEL, **base, "logprobs": 2, "stream": True}, timeout=120,
    ) as resp:  # fmt: skip
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    tops = [t for e in events[:-1] for t in json.loads(e)["choices"][0]["logprobs"]["top_logprobs"]]
    assert len(tops) == 2 and all(sorted(t.values()) == [-9999.0, 0.0] for t in tops)
    chat = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
    chat.update(allowed_token_ids=[28], logprobs=True, top_logprobs=2)
    content = _ok(_post(server, "chat/completions", chat))["choices"][0]["logprobs"]["content"]
    assert [sorted(t["logprob"] for t in c["top_logprobs"]) for c in content] == [
        [-9999.0, 0.0]
    ] * 2


def test_beam_search_equals_llm_beam_search(server, reference):
    """use_beam_search gives n choices, best first, equal to LLM.beam_search's beams (texts
    and finish reasons), streamed or not; chat runs the same search; fields beam search does
    not apply are 400s naming them."""
    want = reference["beam"]
    body = dict(prompt=PROMPT, max_tokens=5, n=3, use_beam_search=True, logprobs=1)
    choices = _ok(_post(server, "completions", body))["choices"]
    assert [(c["text"], c["finish_reason"]) for c in choices] == [(t, f) for t, f, _ in want]
    assert len({c["text"] for c in choices}) == 3
    assert all(len(c["logprobs"]["tokens"]) == 5 for c in choices if c["finish_reason"] == "length")
    with httpx.stream(
        "POST", server.url_for("v1", "completions"), timeout=120,
        json={"model": MODEL, **body, "stream": True},
    ) as r:  # fmt: skip
        texts = {}
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert [texts[i] for i in range(3)] == [t for t, _, _ in want]
    chat = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2)
    reply = _ok(_post(server, "chat/completions", {**chat, "use_beam_search": True}))
    assert len(reply["choices"]) == 2 and reply["choices"][0]["message"]["content"]
    _bad(_post(server, "completions", {**body, "stop": ["."]}), "stop", "use_beam_search")
    _bad(_post(server, "completions", {**body, "n": 11}), "n", "max_logprobs=20")
    _bad(_post(server, "chat/completions", {**chat, "use_beam_search": True,
                                             "guided_regex": "a+"}), "guided_regex")  # fmt: skip
