"""`vllm serve --task embed`: /pooling equals LLM.encode, /score and /v1/score equal the
cosine similarity of transformers' pooled hidden states (and LLM.score) for 1-to-1, 1-to-N
and N-to-N pairs, /rerank, /v1/rerank and /v2/rerank rank documents by that score; bad
requests get a 400 naming the field before anything is queued."""

import base64

import httpx
import numpy as np
import pytest

from tests.pooling.hf_reference import cosine, hf_embeddings, hf_token_ids
from tests.utils import RemoteOpenAIServer, run_in_fork

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server, engine run and transformers reference are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_score_server")

TEXTS = ["What is the capital of France?", "The capital of France is Paris.",
         "Horses and cows are both animals.", "The capital of Brazil is Brasilia."]  # fmt: skip
INPUTS = [[1, 5, 9, 22, 40, 7, 3, 100], [1, 300, 41, 17]]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    srv = RemoteOpenAIServer(tiny_llama_dir, ["--device", "cpu", "--dtype", "float32",
                                              "--max-model-len", "128", "--task", "embed",
                                              "--served-model-name", "emb",
                                              "--trust-request-chat-template"])  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def offline(tiny_llama_dir):
    """LLM.encode of INPUTS and TEXTS[1], LLM.score of TEXTS[0] against TEXTS, in a forked
    child."""

    def run():
        from vllm import LLM

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", task="embed",
                  max_model_len=128)  # fmt: skip
        prompts = [{"prompt_token_ids": p} for p in INPUTS] + [TEXTS[1]]
        encoded = [o.outputs.data.tolist() for o in llm.encode(prompts, use_tqdm=False)]
        scores = [o.outputs.score for o in llm.score(TEXTS[0], TEXTS, use_tqdm=False)]
        return {"encode": encoded, "score": scores}

    return run_in_fork(run)


@pytest.fixture(scope="module")
def ref(tiny_llama_dir):
    """transformers' token ids and pooled vectors of TEXTS."""
    ids = hf_token_ids(tiny_llama_dir, TEXTS)
    return ids, hf_embeddings(tiny_llama_dir, ids)


def _post(server, path, body):
    return httpx.post(server.url_for(*path.strip("/").split("/")), json=body, timeout=120)


def _prompt_tokens(server):
    for line in httpx.get(server.url_for("metrics"), timeout=30).text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_pooling_equals_llm_encode(server, offline):
    r = _post(server, "/pooling", {"model": "emb", "input": INPUTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "emb" and body["id"].startswith("pool-")
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "pooling"), (1, "pooling")]
    # CPU float32, the same code and weights; a batch of other rows may round differently
    # in the last float32 bit, so across batches the vectors are compared to 1e-6
    for got, want in zip([d["data"] for d in body["data"]], offline["encode"][:2]):
        assert got == pytest.approx(want, abs=1e-6)
    assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0,
                             "prompt_tokens_details": None}  # fmt: skip
    text = _post(server, "/pooling", {"input": [TEXTS[1]]}).json()
    assert text["data"][0]["data"] == pytest.approx(offline["encode"][2], abs=1e-6)
    floats = _post(server, "/pooling", {"input": INPUTS[1]}).json()["data"][0]["data"]
    assert floats == pytest.approx(offline["encode"][1], abs=1e-6)
    b64 = _post(server, "/pooling", {"input": INPUTS[1], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(b64["data"][0]["data"]), dtype="<f4")
    assert vec.tolist() == floats  # the same lone request: base64 is the float32 bytes exactly
    emb = _post(server, "/v1/embeddings", {"input": INPUTS}).json()
    for got, want in zip([d["embedding"] for d in emb["data"]], offline["encode"][:2]):
        assert got == pytest.approx(want, abs=1e-6)


def test_score_pairs_equal_transformers_cosine(server, ref, offline):
    ids, vecs = ref
    cases = [  # (text_1, text_2, the pairs as indices into TEXTS)
        (TEXTS[0], TEXTS[1], [(0, 1)]),
        (TEXTS[0], TEXTS, [(0, 0), (0, 1), (0, 2), (0, 3)]),
        ([TEXTS[0]], TEXTS[2:], [(0, 2), (0, 3)]),
        (TEXTS[:3], [TEXTS[3], TEXTS[3], TEXTS[0]], [(0, 3), (1, 3), (2, 0)]),
    ]
    for path in ("/score", "/v1/score"):
        for text_1, text_2, pairs in cases:
            r = _post(server, path, {"model": "emb", "text_1": text_1, "text_2": text_2})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["id"].startswith("score-")
            assert [(d["index"], d["object"]) for d in body["data"]] == [
                (k, "score") for k in range(len(pairs))
            ]
            for d, (i, j) in zip(body["data"], pairs):
                assert d["score"] == pytest.approx(cosine(vecs[i], vecs[j]), abs=1e-5), (i, j)
            # each text embedded and counted once: a lone text_1 once for all pairs
            lone = isinstance(text_1, str) or len(text_1) == 1
            firsts = [pairs[0][0]] if lone else [i for i, _ in pairs]
            n = sum(len(ids[i]) for i in firsts) + sum(len(ids[j]) for _, j in pairs)
            assert body["usage"]["prompt_tokens"] == n == body["usage"]["total_tokens"]
    r = _post(server, "/score", {"text_1": TEXTS[0], "text_2": TEXTS}).json()
    assert [d["score"] for d in r["data"]] == pytest.approx(offline["score"], abs=1e-6)
    assert r["data"][0]["score"] == pytest.approx(1.0, abs=1e-6)  # a text with itself
    assert np.ptp([d["score"] for d in r["data"][1:]]) > 1e-3  # distinct: ranking is tested


def test_rerank_sorts_documents_by_cosine(server, ref):
    ids, vecs = ref
    want = sorted(range(1, 4), key=lambda j: -cosine(vecs[0], vecs[j]))
    body = {"model": "emb", "query": TEXTS[0], "documents": TEXTS[1:]}
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = _post(server, path, body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["id"].startswith("rerank-") and out["model"] == "emb"
        assert [x["index"] for x in out["results"]] == [j - 1 for j in want]
        for x, j in zip(out["results"], want):
            assert x["document"] == {"text": TEXTS[j]}
            assert x["relevance_score"] == pytest.approx(cosine(vecs[0], vecs[j]), abs=1e-5)
        n = sum(len(i) for i in ids)
        assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}
    top = _post(server, "/v1/rerank", {**body, "top_n": 2}).json()["results"]
    assert [x["index"] for x in top] == [j - 1 for j in want[:2]]
    assert len(_post(server, "/rerank", {**body, "top_n": 9}).json()["results"]) == 3


def test_bad_requests_are_refused_before_queueing(server):
    long_text = list(range(1, 200))  # 199 token ids, above max_model_len=128
    before = _prompt_tokens(server)
    cases = [
        ("/pooling", {"input": []}, "input", "input must not be empty"),
        ("/pooling", {"input": long_text}, "input", "maximum context length is 128"),
        ("/pooling", {"input": "x", "dimensions": 8}, "dimensions", "Matryoshka"),
        ("/score", {"text_1": [], "text_2": "a"}, "text_1", "text_1 must hold at least one"),
        ("/score", {"text_1": "a", "text_2": []}, "text_2", "text_2 must hold at least one"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1",
         "text_1 has 2 texts and text_2 has 3"),
        ("/score", {"text_1": "a", "text_2": ["b", ""]}, "text_2", "text_2 must not be empty"),
        ("/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 129},
         "truncate_prompt_tokens", "truncate_prompt_tokens=129 is more than"),
        ("/score", {"text_1": "a " * 300, "text_2": "b"}, "text_1",
         "maximum context length is 128"),
        ("/score", {"text_1": "a"}, "text_2", "text_2"),
        ("/rerank", {"query": "a", "documents": []}, "documents",
         "documents must hold at least one"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n",
         "top_n must be >= 0"),
        ("/v2/rerank", {"query": "", "documents": ["b"]}, "query", "query must not be empty"),
        ("/pooling", {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ '' }}"},
         "messages", "messages gives no tokens"),
    ]  # fmt: skip
    for path, body, param, match in cases:
        r = _post(server, path, body)
        assert r.status_code == 400, (path, body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and match in err["message"], (path, body, err)
    assert _prompt_tokens(server) == before  # nothing was computed
    r = _post(server, "/score", {"model": "other", "text_1": "a", "text_2": "b"})
    assert r.status_code == 404 and "`other` does not exist" in r.json()["error"]["message"]
