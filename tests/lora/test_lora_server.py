"""`vllm serve --enable-lora --lora-modules`: adapters served as models of their own (tiny
Llama on CPU, float32, loopback only). A completion for an adapter's name equals PEFT's
greedy output; /v1/models lists each adapter with the base model as its parent."""

import json

import httpx
import pytest

from tests.lora.conftest import peft_greedy
from tests.utils import RemoteOpenAIServer, run_cli

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_lora_server")

PROMPT = [1, 5, 9, 22, 40, 7, 3, 100, 12, 14, 77, 31]
N = 6


@pytest.fixture(scope="module")
def server(tiny_llama_dir, lora_adapters):
    qv = json.dumps({"name": "qv", "path": lora_adapters["qv"], "base_model_name": "base"})
    args = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
            "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
            "--served-model-name", "base", "--lora-modules", f"all={lora_adapters['all']}",
            qv]  # fmt: skip
    srv = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


def _complete(server, model):
    body = {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0,
            "logprobs": 1, "ignore_eos": True}  # fmt: skip
    return httpx.post(server.url_for("v1", "completions"), json=body, timeout=120)


def test_models_lists_the_adapters(server, lora_adapters):
    cards = httpx.get(server.url_for("v1", "models"), timeout=30).json()["data"]
    got = [(c["id"], c["root"], c["parent"]) for c in cards]
    assert got[0][:1] == ("base",) and got[0][2] is None
    assert got[1:] == [("all", lora_adapters["all"], "base"), ("qv", lora_adapters["qv"], "base")]
    # without VLLM_ALLOW_RUNTIME_LORA_UPDATING the adapters are fixed
    body = {"lora_name": "x", "lora_path": lora_adapters["qv"]}
    assert httpx.post(server.url_for("v1", "load_lora_adapter"), json=body).status_code == 404


def test_completions_run_with_the_named_adapter(server, tiny_llama_dir, lora_adapters):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    for model, adapter in [("all", "all"), ("base", None), ("qv", "qv")]:
        r = _complete(server, model)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == model
        ref_ids, _ = peft_greedy(tiny_llama_dir, adapter and lora_adapters[adapter], PROMPT, N)
        assert body["choices"][0]["text"] == tok.decode(ref_ids), model
    r = _complete(server, "nope")
    assert r.status_code == 404
    assert "Available models: `base`, `all`, `qv`" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lora-modules", "a=/x"], "error: --lora-modules needs --enable-lora."),
        (
            ["--enable-lora", "--max-lora-rank", "4", "--lora-modules", "all={all}"],
            "rank r=8, above max_lora_rank=4",
        ),
        (["--enable-lora", "--lora-modules", "a=/no/such/dir"], "is not a directory"),
    ],
    ids=["no_enable_lora", "rank_too_big", "missing_dir"],
)
def test_bad_lora_flags_are_one_error_line(tiny_llama_dir, lora_adapters, flags, message):
    flags = [f.format(all=lora_adapters["all"]) for f in flags]
    proc = run_cli("serve", tiny_llama_dir, "--device", "cpu", "--port", "0", "--max-model-len",
                   "128", *flags, env={"VLLM_CPU_KVCACHE_SPACE": "0.1"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last


def test_adapters_loaded_and_unloaded_at_run_time(tiny_llama_dir, lora_adapters):
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: POST /v1/load_lora_adapter serves a new name at
    once, /v1/unload_lora_adapter stops it; bad loads are 400s naming the problem."""
    args = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256", "--enable-lora",
            "--max-lora-rank", "8", "--served-model-name", "base"]  # fmt: skip
    srv = RemoteOpenAIServer(tiny_llama_dir, args, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    try:

        def post(path, body):
            return httpx.post(srv.url_for("v1", path), json=body, timeout=60)

        r = post("load_lora_adapter", {"lora_name": "mine", "lora_path": lora_adapters["qv"]})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'mine' added successfully.")
        ids = [c["id"] for c in httpx.get(srv.url_for("v1", "models"), timeout=30).json()["data"]]
        assert ids == ["base", "mine"]
        from transformers import AutoTokenizer

        ref_ids, _ = peft_greedy(tiny_llama_dir, lora_adapters["qv"], PROMPT, N)
        body = _complete(srv, "mine").json()
        assert body["choices"][0]["text"] == AutoTokenizer.from_pretrained(tiny_llama_dir).decode(
            ref_ids
        )
        base = post("load_lora_adapter", {"lora_name": "base", "lora_path": lora_adapters["all"]})
        assert base.status_code == 400 and "name of the served base model" in base.text
        again = post("load_lora_adapter", {"lora_name": "mine", "lora_path": lora_adapters["all"]})
        assert again.status_code == 400 and "has already been loaded" in again.text
        # load_inplace replaces the adapter served under the name (a base name stays refused)
        body = {"lora_name": "mine", "lora_path": lora_adapters["all"], "load_inplace": True}
        assert post("load_lora_adapter", body).status_code == 200
        all_ids, _ = peft_greedy(tiny_llama_dir, lora_adapters["all"], PROMPT, N)
        assert _complete(srv, "mine").json()["choices"][0]["text"] == AutoTokenizer.from_pretrained(
            tiny_llama_dir
        ).decode(all_ids)
        assert all_ids != ref_ids
        body = {"lora_name": "base", "lora_path": lora_adapters["all"], "load_inplace": True}
        assert post("load_lora_adapter", body).status_code == 400
        bad = post(
            "load_lora_adapter", {"lora_name": "x", "lora_path": lora_adapters["qv"] + "/no"}
        )
        assert bad.status_code == 400 and "is not a directory" in bad.json()["error"]["message"]
        r = post("unload_lora_adapter", {"lora_name": "mine"})
        assert (r.status_code, r.text) == (
            200,
            "Success: LoRA adapter 'mine' removed successfully.",
        )
        assert _complete(srv, "mine").status_code == 404
        assert post("unload_lora_adapter", {"lora_name": "mine"}).status_code == 404
    finally:
        srv.stop()


def test_beam_search_with_an_adapter(server, tiny_llama_dir, lora_adapters):
    """use_beam_search with an adapter's name searches with that adapter: width 1 is its
    greedy output (PEFT's), and the base model's differs."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    texts = {}
    for model, adapter in [("all", "all"), ("base", None)]:
        body = {"model": model, "prompt": PROMPT, "max_tokens": N, "use_beam_search": True,
                "n": 1, "ignore_eos": True, "temperature": 0}  # fmt: skip
        r = httpx.post(server.url_for("v1", "completions"), json=body, timeout=120)
        assert r.status_code == 200, r.text
        ref_ids, _ = peft_greedy(tiny_llama_dir, adapter and lora_adapters[adapter], PROMPT, N)
        texts[model] = r.json()["choices"][0]["text"]
        assert texts[model] == tok.decode(ref_ids), model
    assert texts["all"] != texts["base"]
