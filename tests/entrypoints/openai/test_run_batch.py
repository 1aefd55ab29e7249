"""`vllm run-batch` on SmolLM2 (CPU): each line answered as `vllm serve` would, in input
order: a completion equal to LLM.generate's greedy text, a chat reply, a refused body with
its 400 and error (an embeddings line on a generate model among them), and lines that are not
requests with ``error`` set."""

import json
import subprocess
import sys

from tests.utils import run_in_fork

PROMPT = "The capital of France is"


def test_run_batch_answers_each_line_as_the_server(smollm2_gguf, tmp_path):
    def reference():
        from vllm import LLM, SamplingParams

        llm = LLM(smollm2_gguf, device="cpu", max_model_len=512)
        return (
            llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0].text
        )

    want = run_in_fork(reference)
    lines = [
        {"custom_id": "c1", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}},
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": "x", "max_tokens": -1}},
        {"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"custom_id": "models", "method": "POST", "url": "/v1/models", "body": {}},
    ]  # fmt: skip
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines[:3]) + "\nnot json\n"
                   + "\n".join(json.dumps(x) for x in lines[3:]) + "\n")  # fmt: skip
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli", "run-batch", "-i", str(src), "-o",
           str(dst), "--model", smollm2_gguf, "--device", "cpu", "--max-model-len", "512",
           "--served-model-name", "m"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["c1", "chat", "bad", None, "emb", "models"]
    c1, chat, bad, junk, emb, models = out
    assert c1["response"]["status_code"] == 200 and c1["error"] is None
    assert c1["response"]["body"]["choices"][0]["text"] == want
    assert chat["response"]["body"]["choices"][0]["message"]["content"]
    assert chat["response"]["body"]["usage"]["completion_tokens"] == 4
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["param"] == "max_tokens"
    assert junk["response"] is None and junk["error"].startswith("invalid JSON")
    assert emb["response"]["status_code"] == 400 and emb["error"] is None
    assert "embed" in emb["response"]["body"]["error"]["message"]
    assert models["response"] is None and "url must be one of" in models["error"]
    assert len({o["id"] for o in out}) == 6


def test_run_batch_bad_input_file_is_one_line(tmp_path):
    missing, dst = str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl")
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli", "run-batch", "-i", missing, "-o", dst,
           "--device", "cpu"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "error:" in r.stderr and "missing.jsonl" in r.stderr, r.stderr
