"""Models named by Hugging Face Hub repository (vllm/transformers_utils/hub.py), read from
a Hub cache laid out as huggingface_hub writes it, with HF_HUB_OFFLINE=1 (no network): the
engine resolves ``org/name`` (at a revision) to its snapshot and runs it; a repository
missing from the cache is refused naming it; local paths never reach the Hub."""

import shutil

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.transformers_utils.hub import is_repo_id, resolve_model_path

MAIN = "0123456789abcdef0123456789abcdef01234567"
V2 = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def hub_cache(tmp_path, tiny_llama_dir, monkeypatch):
    """A cache holding testorg/tiny-llama at main and at tag v2 (both the tiny Llama)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "models--testorg--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    for ref, commit in (("main", MAIN), ("v2", V2)):
        (repo / "refs" / ref).write_text(commit)
        shutil.copytree(tiny_llama_dir, repo / "snapshots" / commit)
    return tmp_path


def test_repo_id_shapes(tmp_path):
    assert is_repo_id("Qwen/Qwen2.5-0.5B-Instruct") and is_repo_id("gpt2")
    for name in ("/abs/dir", "./rel", "~/m", "a/b/c", "model.gguf", "org/..x", "org/"):
        assert not is_repo_id(name), name
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    assert resolve_model_path(str(local), revision="v2") == str(local)  # a path wins


def test_repo_id_resolves_to_its_snapshot_at_a_revision(hub_cache):
    snap = resolve_model_path("testorg/tiny-llama", download_dir=str(hub_cache))
    assert snap == str(hub_cache / "models--testorg--tiny-llama" / "snapshots" / MAIN)
    at_v2 = resolve_model_path("testorg/tiny-llama", "v2", str(hub_cache))
    assert at_v2.endswith(V2)
    with pytest.raises(
        ValueError,
        match=r"model 'testorg/absent' is not a local path, and "
        r"Hugging Face Hub repository 'testorg/absent' could not be fetched",
    ):
        resolve_model_path("testorg/absent", download_dir=str(hub_cache))
    with pytest.raises(ValueError, match=r"at revision 'v3' could not be fetched"):
        resolve_model_path("testorg/tiny-llama", "v3", str(hub_cache))


def test_engine_config_reads_the_snapshot(hub_cache):
    cfg = EngineArgs(model="testorg/tiny-llama", revision="v2", download_dir=str(hub_cache),
                     device="cpu").create_engine_config()  # fmt: skip
    assert cfg.model_config.model.endswith(V2)
    assert cfg.model_config.tokenizer.endswith(V2)
    assert cfg.model_config.hf_config.num_hidden_layers == 3


@pytest.mark.forked
def test_llm_generates_from_a_repo_id_as_from_its_directory(hub_cache, tiny_llama_dir):
    from tests.utils import check_outputs_equal, vllm_greedy
    from vllm import LLM

    prompts = ["Hello, my name is", "The capital of France is"]
    by_id = LLM("testorg/tiny-llama", download_dir=str(hub_cache), device="cpu")
    got = vllm_greedy(by_id, prompts, 8)
    by_id.llm_engine.shutdown()
    by_dir = LLM(tiny_llama_dir, device="cpu")
    check_outputs_equal(vllm_greedy(by_dir, prompts, 8), got, "directory", "repo id", prompts)


def test_hf_token_reaches_the_hub(tiny_llama_dir, monkeypatch):
    """``--hf-token``: the token itself, or the flag alone for the stored login (True),
    handed to huggingface_hub for the model's repository."""
    import argparse

    import huggingface_hub

    seen = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda **kw: seen.append(kw) or tiny_llama_dir)  # fmt: skip
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    assert parser.parse_args(["--hf-token"]).hf_token is True
    assert parser.parse_args([]).hf_token is None
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "org/gated", "--hf-token",
                                                       "hf_abc", "--device", "cpu"]))  # fmt: skip
    assert args.create_engine_config().model_config.model == tiny_llama_dir
    assert [(kw["repo_id"], kw["token"]) for kw in seen] == [("org/gated", "hf_abc")]
