"""`vllm run-batch` on SmolLM2 (CPU): each line answered as `vllm serve` would, in input
order: a completion equal to LLM.generate's greedy text, a chat reply rendered with
``--chat-template-content-format openai`` (its prompt equal to LLM.chat's), a refused body with
its 400 and error (an embeddings line on a generate model among them), and lines that are not
requests with ``error`` set."""

import json
import os
import subprocess
import sys

from tests.utils import run_cli, run_in_fork

PROMPT = "The capital of France is"
# prints each content as it arrives: "auto" would detect "string" here (no loop over the
# parts), so the parts list reaching it proves the flag reached the server's chat path
PARTS_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
PARTS = [
    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "you"}]}
]


def test_run_batch_answers_each_line_as_the_server(smollm2_gguf, tmp_path):
    def reference():
        from vllm import LLM, SamplingParams

        llm = LLM(smollm2_gguf, device="cpu", max_model_len=512)
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        chat = llm.chat(PARTS, SamplingParams(max_tokens=2), chat_template=PARTS_TEMPLATE,
                        chat_template_content_format="openai")  # fmt: skip
        return llm.generate(PROMPT, greedy)[0].outputs[0].text, len(chat[0].prompt_token_ids)

    want, parts_tokens = run_in_fork(reference)
    lines = [
        {"custom_id": "c1", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}},
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": PARTS, "max_tokens": 4}},
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
           "--served-model-name", "m", "--chat-template", PARTS_TEMPLATE,
           "--chat-template-content-format", "openai"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["c1", "chat", "bad", None, "emb", "models"]
    c1, chat, bad, junk, emb, models = out
    assert c1["response"]["status_code"] == 200 and c1["error"] is None
    assert c1["response"]["body"]["choices"][0]["text"] == want
    assert chat["response"]["body"]["choices"][0]["message"]["content"]
    assert chat["response"]["body"]["usage"]["completion_tokens"] == 4
    # the template read the parts list: the prompt is LLM.chat's with the same format
    assert chat["response"]["body"]["usage"]["prompt_tokens"] == parts_tokens
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["param"] == "max_tokens"
    assert junk["response"] is None and junk["error"].startswith("invalid JSON")
    assert emb["response"]["status_code"] == 400 and emb["error"] is None
    assert "embed" in emb["response"]["body"]["error"]["message"]
    assert models["response"] is None and "url must be one of" in models["error"]
    assert len({o["id"] for o in out}) == 6


def test_run_batch_bad_input_file_is_one_line(tmp_path):
    missing, dst = str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl")
    r = run_cli("run-batch", "-i", missing, "-o", dst, "--device", "cpu")
    assert r.returncode == 2 and "error:" in r.stderr and "missing.jsonl" in r.stderr, r.stderr


def test_run_batch_unwritable_output_is_one_line_before_loading(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    for dst, why in [(tmp_path / "no" / "o.jsonl", "does not exist"),
                     (tmp_path, "is a directory"),
                     ("/proc/version", "is not writable")]:  # fmt: skip
        r = run_cli("run-batch", "-i", str(src), "-o", str(dst), "--device", "cpu")
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and why in lines[0], r.stderr
    assert not (tmp_path / "no").exists()
    from vllm.entrypoints.openai.run_batch import check_writable

    check_writable(str(tmp_path / "new.jsonl"))  # writable: nothing is left behind
    assert not (tmp_path / "new.jsonl").exists()


def test_run_batch_serves_the_given_model_string(tiny_llama_dir, tmp_path):
    """Without --served-model-name a line's ``model`` may be the exact --model string (as
    upstream) or its short name; another name is 404. Guards: the given path answered 404."""
    short = os.path.basename(os.path.normpath(tiny_llama_dir))
    lines = [
        {"custom_id": name, "method": "POST", "url": "/v1/completions",
         "body": {"model": name, "prompt": "hi", "max_tokens": 1}}
        for name in (tiny_llama_dir, short, "other")
    ]  # fmt: skip
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run_cli("run-batch", "-i", str(src), "-o", str(dst), "--model", tiny_llama_dir,
                "--device", "cpu", "--max-model-len", "64")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = {o["custom_id"]: o["response"] for o in map(json.loads, dst.read_text().splitlines())}
    for name in (tiny_llama_dir, short):
        assert out[name]["status_code"] == 200 and out[name]["body"]["model"] == name
    assert out["other"]["status_code"] == 404


def test_run_batch_reads_a_config_file(tiny_llama_dir, tmp_path):
    """``--config FILE`` gives run-batch flags from YAML, as upstream, and typed flags win
    (the file's max-model-len 9999 is above the model's limit, the typed 64 is not).
    Guards: run-batch refused ``--config`` ("unrecognized arguments")."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {tiny_llama_dir}\nmax-model-len: 9999\nserved-model-name: [cfg]\n"
                   "device: cpu\n")  # fmt: skip
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "cfg", "prompt": "hi", "max_tokens": 1}})
                   + "\n")  # fmt: skip
    cmd = ["run-batch", "-i", str(src), "-o", str(dst), "--config", str(cfg), "--max-model-len",
           "64"]  # fmt: skip
    r = run_cli(*cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    (out,) = map(json.loads, dst.read_text().splitlines())
    assert out["response"]["status_code"] == 200 and out["response"]["body"]["model"] == "cfg"
    cfg.write_text("port: 8000\n")  # a vllm serve flag, not one of run-batch
    r = run_cli(*cmd)
    assert r.returncode == 2
    assert r.stderr == f"error: {cfg}: 'port' is not a flag of vllm run-batch (see --help).\n"
