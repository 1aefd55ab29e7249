"""`vllm run-batch --task embed`: embeddings, score and rerank lines answered as the server
answers them: vectors equal to LLM.encode's, scores equal to the cosine similarity of
transformers' pooled hidden states on the same weights."""

import json
import subprocess
import sys

import pytest

from tests.pooling.hf_reference import cosine, hf_embeddings, hf_token_ids
from tests.utils import run_in_fork

TEXTS = ["What is the capital of France?", "The capital of France is Paris.",
         "Horses and cows are both animals."]  # fmt: skip
IDS = [1, 5, 9, 22, 40, 7, 3, 100]


def test_run_batch_embeddings_score_rerank(tiny_llama_dir, tmp_path):
    def encode():
        from vllm import LLM

        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", task="embed",
                  max_model_len=128)  # fmt: skip
        return llm.encode([{"prompt_token_ids": IDS}], use_tqdm=False)[0].outputs.data.tolist()

    want_vec = run_in_fork(encode)
    vecs = hf_embeddings(tiny_llama_dir, hf_token_ids(tiny_llama_dir, TEXTS))
    lines = [
        {"custom_id": "e", "url": "/v1/embeddings", "body": {"model": "emb", "input": IDS}},
        {"custom_id": "s", "url": "/v1/score",
         "body": {"model": "emb", "text_1": TEXTS[0], "text_2": TEXTS[1:]}},
        {"custom_id": "r", "url": "/v1/rerank",
         "body": {"model": "emb", "query": TEXTS[0], "documents": TEXTS[1:]}},
        {"custom_id": "s0", "url": "/score", "body": {"text_1": TEXTS[0], "text_2": TEXTS[1:]}},
        {"custom_id": "r2", "url": "/v2/rerank",
         "body": {"query": TEXTS[0], "documents": TEXTS[1:]}},
    ]  # fmt: skip
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"method": "POST", **x}) + "\n" for x in lines))
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli", "run-batch", "-i", str(src), "-o",
           str(dst), "--model", tiny_llama_dir, "--device", "cpu", "--dtype", "float32",
           "--max-model-len", "128", "--task", "embed", "--served-model-name", "emb"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = {o["custom_id"]: o["response"] for o in map(json.loads, dst.read_text().splitlines())}
    assert all(resp["status_code"] == 200 for resp in out.values()), out
    # same code, CPU float32; lines run concurrently, so other rows may share the batch and
    # change the last float32 bit
    assert out["e"]["body"]["data"][0]["embedding"] == pytest.approx(want_vec, abs=1e-6)
    scores = [d["score"] for d in out["s"]["body"]["data"]]
    assert scores == pytest.approx([cosine(vecs[0], vecs[j]) for j in (1, 2)], abs=1e-5)
    assert abs(scores[0] - scores[1]) > 1e-3  # distinct, so the order below is tested
    ranked = out["r"]["body"]["results"]
    assert [x["index"] for x in ranked] == sorted((0, 1), key=lambda i: -scores[i])
    assert [x["relevance_score"] for x in ranked] == pytest.approx(sorted(scores)[::-1])
    # the other spellings
    assert [d["score"] for d in out["s0"]["body"]["data"]] == pytest.approx(scores, abs=1e-6)
    ranked2 = out["r2"]["body"]["results"]
    assert [(x["index"], x["document"]) for x in ranked2] == [
        (x["index"], x["document"]) for x in ranked
    ]
    assert [x["relevance_score"] for x in ranked2] == pytest.approx(sorted(scores)[::-1])
