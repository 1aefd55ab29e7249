"""A GGUF file's config and tokenizer: converted by transformers once, then read from disk.

The engine's config and tokenizer for a .gguf path
(vllm.transformers_utils.hf_config.load_hf_config,
vllm.transformers_utils.tokenizer.load_tokenizer) must equal what transformers makes of the
file directly; a second use must not convert again; a changed file must.
"""

import os

import pytest

from vllm.transformers_utils import gguf_metadata

TEXTS = [
    "Hello world",
    "The capital of France is",
    "<|im_start|>user\nhi<|im_end|>\n",
    "ünïcødé 東京  two spaces\t\ttabs",
]


def test_config_and_tokenizer_equal_transformers_direct(tiny_llama_gguf, tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    from vllm.transformers_utils.hf_config import _load_hf_config_cached, load_hf_config
    from vllm.transformers_utils.tokenizer import load_tokenizer

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    _load_hf_config_cached.cache_clear()  # other tests of this process may have parsed it
    d, f = os.path.dirname(tiny_llama_gguf), os.path.basename(tiny_llama_gguf)
    want_cfg = AutoConfig.from_pretrained(d, gguf_file=f).to_dict()
    want_tok = AutoTokenizer.from_pretrained(d, gguf_file=f)

    got_cfg = load_hf_config(tiny_llama_gguf).to_dict()
    got_tok = load_tokenizer(tiny_llama_gguf)
    assert os.listdir(tmp_path / "gguf_metadata"), "nothing was cached"
    want_cfg.pop("_name_or_path"), got_cfg.pop("_name_or_path")  # where it was read from
    # transformers leaves a GGUF config's architectures unset; the engine names the class
    assert want_cfg.pop("architectures") is None
    assert got_cfg.pop("architectures") == ["LlamaForCausalLM"]
    assert got_cfg == want_cfg
    assert len(got_tok) == len(want_tok) == want_cfg["vocab_size"]
    for text in TEXTS:
        ids = want_tok.encode(text)
        assert got_tok.encode(text) == ids, text
        assert got_tok.decode(ids) == want_tok.decode(ids), text
    assert (got_tok.bos_token_id, got_tok.eos_token_id) == (
        want_tok.bos_token_id,
        want_tok.eos_token_id,
    )
    assert got_tok.chat_template == want_tok.chat_template


def test_second_use_reads_the_cache_and_a_changed_file_converts_again(
    tiny_llama_gguf, tmp_path, monkeypatch
):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    calls = []

    def fake_convert(path, out):
        calls.append(path)
        with open(os.path.join(out, "config.json"), "w") as fh:
            fh.write("{}")

    monkeypatch.setattr(gguf_metadata, "_convert", fake_convert)
    copy = tmp_path / "model.gguf"
    copy.write_bytes(b"GGUF placeholder")
    first = gguf_metadata.gguf_metadata_dir(str(copy))
    assert gguf_metadata.gguf_metadata_dir(str(copy)) == first
    assert len(calls) == 1
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = gguf_metadata.gguf_metadata_dir(str(copy))
    assert second != first and len(calls) == 2
    assert not gguf_metadata.has_tokenizer(second)


def test_unwritable_cache_root_still_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(blocker / "cache"))
    calls = []

    def fake_convert(path, out):
        calls.append(path)
        open(os.path.join(out, "config.json"), "w").close()

    monkeypatch.setattr(gguf_metadata, "_convert", fake_convert)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF placeholder")
    out = gguf_metadata.gguf_metadata_dir(str(model))
    assert os.path.isfile(os.path.join(out, "config.json"))
    assert not out.startswith(str(blocker))
    # the config and the tokenizer ask in turn: one conversion per process
    assert gguf_metadata.gguf_metadata_dir(str(model)) == out
    assert len(calls) == 1


def test_missing_file_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        gguf_metadata.gguf_metadata_dir(str(tmp_path / "absent.gguf"))
