"""`vllm serve --task embed`: /v1/embeddings equals LLM.embed on the same weights (float
lists and base64 float32), with OpenAI's response shape and usage; the generation APIs
answer 400 on it, and the pooling APIs (/v1/embeddings, /pooling, /score, /rerank) answer
400 on a generative server."""

import base64

import httpx
import numpy as np
import pytest

from tests.utils import RemoteOpenAIServer

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_embed_server")

INPUTS = [[1, 5, 9, 22, 40, 7, 3, 100], [1, 300, 41, 17]]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    srv = RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", "--dtype", "float32",
                                              "--max-model-len", "128", "--task", "embed",
                                              "--served-model-name", "emb",
                                              "--enable-request-id-headers",
                                              "--disable-fastapi-docs",
                                              "--trust-request-chat-template"])  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def _post(server, path, body):
    return httpx.post(server.url_for("v1", path), json=body, timeout=120)


def _reference(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            torch.nn.functional.normalize(
                model.model(torch.tensor([ids])).last_hidden_state[0, -1], dim=0
            ).numpy()
            for ids in INPUTS
        ]


def test_embeddings_equal_transformers(server, tiny_llama_dir):
    ref = _reference(tiny_llama_dir)
    r = _post(server, "embeddings", {"model": "emb", "input": INPUTS})
    assert r.status_code == 200, r.text
    assert len(r.headers["x-request-id"]) == 32  # --enable-request-id-headers
    assert httpx.get(server.url_for("docs"), timeout=30).status_code == 404  # no docs
    body = r.json()
    assert body["object"] == "list" and body["model"] == "emb"
    assert body["id"] == "embd-" + r.headers["x-request-id"]  # the echoed fresh id
    assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0,
                             "prompt_tokens_details": None}  # fmt: skip
    assert [d["index"] for d in body["data"]] == [0, 1]
    for d, want in zip(body["data"], ref):
        assert d["object"] == "embedding"
        np.testing.assert_allclose(np.array(d["embedding"]), want, atol=1e-5)
    b64 = _post(server, "embeddings", {"input": INPUTS[1], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, ref[1], atol=1e-5)
    text = _post(server, "embeddings", {"input": "Hello world"})
    assert text.status_code == 200 and len(text.json()["data"][0]["embedding"]) == 64


def test_request_id_header_names_the_embedding_requests(server):
    """X-Request-Id is the base of the response id and of each input's engine id
    (``embd-<id>-<i>``, seen in the request log) and is echoed back."""
    r = httpx.post(server.url_for("v1", "embeddings"), json={"input": INPUTS},
                   headers={"X-Request-Id": "emb-trace"}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "embd-emb-trace" and r.headers["x-request-id"] == "emb-trace"
    log = server.read_log()
    for i in range(len(INPUTS)):
        assert f"Received request embd-emb-trace-{i}: " in log
    # the body's request_id names /score and /rerank requests too
    pair = {"text_1": "a b", "text_2": "c d", "request_id": "pair-7"}
    assert _post(server, "score", pair).json()["id"] == "score-pair-7"
    ranked = {"query": "a b", "documents": ["c d"], "request_id": "rank-7"}
    assert _post(server, "rerank", ranked).json()["id"] == "rerank-rank-7"


def test_embedding_server_refusals(server):
    for path, body, param in [
        ("completions", {"prompt": "hi"}, "model"),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("embeddings", {"input": []}, "input"),
        ("embeddings", {"input": list(range(1, 200))}, "input"),
        ("embeddings", {"input": "x", "dimensions": 8}, "dimensions"),
    ]:
        r = _post(server, path, body)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == param, (path, r.json())
    assert (
        "maximum context length is 128"
        in _post(server, "embeddings", {"input": list(range(1, 200))}).json()["error"]["message"]
    )


def test_invocations_on_an_embedding_server(server, tiny_llama_dir):
    """SageMaker's /invocations on an embedding server is an embeddings request, as
    upstream routes it: ``input`` (or chat ``messages``) gives /v1/embeddings' vectors."""
    r = httpx.post(server.url_for("invocations"), json={"input": INPUTS}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["usage"]["prompt_tokens"] == 12
    for d, want in zip(body["data"], _reference(tiny_llama_dir)):
        assert d["object"] == "embedding"
        np.testing.assert_allclose(np.array(d["embedding"]), want, atol=1e-5)
    chat = {"messages": [{"role": "user", "content": "Where is Paris?"}]}
    r = httpx.post(server.url_for("invocations"), json=chat, timeout=120)
    assert r.status_code == 200, r.text
    want = _post(server, "embeddings", chat).json()["data"][0]["embedding"]
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], want, atol=1e-6)
    r = httpx.post(server.url_for("invocations"), json={"prompt": "hi"}, timeout=120)
    assert r.status_code == 400 and "exactly one of input and messages" in r.text, r.text


def test_generative_server_refuses_pooling_apis(tiny_llama_dir):
    """Every pooling route answers 400 naming its API on a generative server; the score
    routes say that cross-encoders are not served."""
    srv = RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", "--max-model-len", "128"])
    score = {"text_1": "a", "text_2": "b"}
    rerank = {"query": "a", "documents": ["b"]}
    try:
        for path, body, api in [
            (("v1", "embeddings"), {"input": "hi"}, "Embeddings"),
            (("pooling",), {"input": "hi"}, "Pooling"),
            (("score",), score, "Score"),
            (("v1", "score"), score, "Score"),
            (("rerank",), rerank, "Re-rank"),
            (("v1", "rerank"), rerank, "Re-rank"),
            (("v2", "rerank"), rerank, "Re-rank"),
        ]:
            r = httpx.post(srv.url_for(*path), json=body, timeout=120)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert err["param"] == "model", (path, err)
            assert f"does not support the {api} API (serve it with --task embed)" in err["message"]
            if api in ("Score", "Re-rank"):
                assert (
                    "cross-encoder models (upstream's --task score) are not served"
                    in (err["message"])
                )
    finally:
        srv.stop()


def test_embeddings_truncate_prompt_tokens(server):
    """truncate_prompt_tokens keeps each input's last k tokens; -1 keeps the last
    max_model_len (128) of a longer input, as completions do; k above 128 is a 400."""
    long_ids = list(range(1, 200))  # 199 tokens: above max_model_len alone

    def vec(body):
        r = _post(server, "embeddings", body)
        assert r.status_code == 200, r.text
        return np.array(r.json()["data"][0]["embedding"]), r.json()["usage"]["prompt_tokens"]

    cut, n = vec({"input": long_ids, "truncate_prompt_tokens": -1})
    want, _ = vec({"input": long_ids[-128:]})
    assert n == 128
    np.testing.assert_allclose(cut, want, atol=1e-6)
    four, n = vec({"input": INPUTS[0], "truncate_prompt_tokens": 4})
    assert n == 4
    np.testing.assert_allclose(four, vec({"input": INPUTS[0][-4:]})[0], atol=1e-6)
    for k in (129, 0, -2):
        r = _post(server, "embeddings", {"input": INPUTS[0], "truncate_prompt_tokens": k})
        assert r.status_code == 400, (k, r.text)
        assert r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_embeddings_count_prompt_tokens_not_generation_tokens(server):
    """An embedding request computes its prompt and generates nothing: /metrics counts
    its prompt tokens and no generation tokens."""

    def series(name):
        for line in httpx.get(server.url_for("metrics"), timeout=30).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = series("vllm:prompt_tokens_total")
    r = _post(server, "embeddings", {"input": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]})
    assert r.status_code == 200
    assert series("vllm:generation_tokens_total") == 0
    assert series("vllm:request_generation_tokens_sum") == 0
    assert series("vllm:prompt_tokens_total") - before == 11


def test_normalize_per_request(server, tiny_llama_dir):
    """ "normalize": false gives transformers' raw pooled vector, true and absent the unit
    one (the default pooler config normalizes), on /v1/embeddings and /pooling; requests
    with and without normalization sent at once share the engine's steps."""
    import asyncio

    import torch

    from tests.pooling.hf_reference import hf_embeddings

    raw = [v.numpy() for v in hf_embeddings(tiny_llama_dir, INPUTS, normalize=False)]
    unit = [v / np.linalg.norm(v) for v in raw]

    async def send_all(bodies):
        async with httpx.AsyncClient(timeout=120) as client:
            rs = await asyncio.gather(*(client.post(server.url_for(*p), json=b) for p, b in bodies))
        return [r.json() for r in rs]

    flags = (False, True, None)
    bodies = [(("v1", "embeddings"), {"input": INPUTS, "normalize": f}) for f in flags]
    bodies.append((("pooling",), {"input": INPUTS, "normalize": False}))
    got = asyncio.run(send_all(bodies))
    for body, want in zip(got, [raw, unit, unit, raw]):
        vecs = [d.get("embedding", d.get("data")) for d in body["data"]]
        for v, w in zip(vecs, want):
            np.testing.assert_allclose(np.array(v), w, atol=1e-5)
    assert abs(float(torch.tensor(raw[0]).norm()) - 1) > 0.1  # the raw vector is not unit
    r = _post(server, "embeddings", {"input": "x", "normalize": "sometimes"})
    assert r.status_code == 400 and "normalize" in r.text


MESSAGES = [{"role": "system", "content": "You embed."},
            {"role": "user", "content": "Where is Paris?"}]  # fmt: skip
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def _tokenize(server, **body):
    r = httpx.post(server.url_for("tokenize"), json={"messages": MESSAGES, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_messages_embed_the_rendered_chat(server, tiny_llama_dir):
    """messages are rendered with the chat template as /tokenize renders them
    (add_generation_prompt false by default, as upstream for embeddings): the embedding
    is the one of those token ids given as input, and transformers' on them; the
    request's chat_template and add_generation_prompt apply, on /pooling too."""
    from tests.pooling.hf_reference import hf_embeddings

    for extra in ({}, {"add_generation_prompt": True}, {"chat_template": TEMPLATE}):
        ids = _tokenize(server, **{"add_generation_prompt": False, **extra})
        r = _post(server, "embeddings", {"messages": MESSAGES, **extra})
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["usage"]["prompt_tokens"] == len(ids), extra
        got = np.array(r.json()["data"][0]["embedding"])
        by_ids = _post(server, "embeddings", {"input": ids}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, np.array(by_ids), atol=1e-6)
        (want,) = hf_embeddings(tiny_llama_dir, [ids])
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    default, with_gen = _tokenize(server, add_generation_prompt=False), _tokenize(server)
    assert default != with_gen  # add_generation_prompt changes the rendered ids
    assert _tokenize(server, add_generation_prompt=False, chat_template=TEMPLATE) != default
    pooled = httpx.post(server.url_for("pooling"), timeout=120,
                        json={"messages": MESSAGES, "normalize": False}).json()  # fmt: skip
    (raw,) = hf_embeddings(tiny_llama_dir, [default], normalize=False)
    np.testing.assert_allclose(np.array(pooled["data"][0]["data"]), raw.numpy(), atol=1e-5)


def test_messages_refusals(server):
    """Exactly one of input and messages; the chat endpoint's refusals of bad messages
    and options; truncate_prompt_tokens keeps the rendered prompt's last tokens."""
    for path in (("v1", "embeddings"), ("pooling",)):
        for body in ({"input": "hi", "messages": MESSAGES}, {}):
            r = httpx.post(server.url_for(*path), json=body, timeout=60)
            assert r.status_code == 400, (path, body, r.text)
            err = r.json()["error"]
            assert err["param"] == "input" and "exactly one of input and messages" in err[
                "message"], err  # fmt: skip
    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
         "continue_final_message"),
        ({"messages": MESSAGES, "chat_template": "{{ messages[0].nope() }}"}, "messages"),
    ]:  # fmt: skip
        r = _post(server, "embeddings", body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, r.json()
    ids = _tokenize(server, add_generation_prompt=False)
    r = _post(server, "embeddings", {"messages": MESSAGES, "truncate_prompt_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3, r.text
    want = _post(server, "embeddings", {"input": ids[-3:]}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], want, atol=1e-6)
