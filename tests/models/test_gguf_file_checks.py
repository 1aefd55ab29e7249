"""GGUF files that cannot be loaded are refused when the model config is validated, with
a message naming the file and the reason (vllm/model_executor/model_loader/gguf_checks.py).

Guards: a truncated file failed with numpy's "cannot reshape array of size ..." (no file
named, after transformers had parsed the metadata); the first shard of a split GGUF was
accepted and the engine failed only after building the model ("7 parameters were not
found"); a tensor type ``gguf.quants`` cannot dequantize (Q8_K, F64) was accepted and the
engine failed while loading weights ("Dequantization for Q8_K is not yet implemented"); a
tokenizer transformers cannot build (an unsupported ``tokenizer.ggml.model``) was reported as
"the file has no tokenizer in its metadata". A GGUF file is recognised as upstream
recognises it, by a ``.gguf`` name or its magic bytes: one saved under another name was
taken for a Hugging Face directory ("has no config.json").
"""

import numpy as np
import pytest

HIDDEN, FFN, VOCAB = 32, 256, 64


def _write_tiny_llama_gguf(
    path: str, ffn_down_type: str = "F32", split_max_tensors: int = 0, tokenizer: str = ""
):
    """A one-layer Llama GGUF (random float32 weights); ``ffn_down`` stored as
    ``ffn_down_type`` (zero blocks for a quantized type); ``split_max_tensors`` > 0 writes
    it as llama.cpp's split shards (``-0000k-of-0000n.gguf``); ``tokenizer``: the
    ``tokenizer.ggml.model`` of a one-token-per-id vocabulary, none when empty."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if tokenizer:
        writer.add_tokenizer_model(tokenizer)
        writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "output.weight": (VOCAB, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.ffn_norm.weight": (HIDDEN,),
        **{f"blk.0.attn_{p}.weight": (HIDDEN, HIDDEN) for p in ("q", "k", "v", "output")},
        "blk.0.ffn_gate.weight": (FFN, HIDDEN),
        "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
    }
    for name, shape in shapes.items():
        array = rng.standard_normal(shape).astype(np.float32)
        if name == "blk.0.ffn_down.weight" and ffn_down_type == "F64":
            writer.add_tensor(name, array.astype(np.float64))
        elif name == "blk.0.ffn_down.weight" and ffn_down_type != "F32":
            qtype = gguf.GGMLQuantizationType[ffn_down_type]
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((HIDDEN, FFN // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))


def test_a_valid_file_is_accepted(tmp_path):
    from vllm.config import ModelConfig

    path = str(tmp_path / "ok.gguf")
    _write_tiny_llama_gguf(path, ffn_down_type="Q4_K")
    config = ModelConfig(model=path, skip_tokenizer_init=True)
    assert config.hf_config.architectures == ["LlamaForCausalLM"]
    assert config.max_model_len == 64  # llama.context_length


def test_read_gguf_equals_gguf_reader(tmp_path):
    """``read_gguf`` (the engine's reader: plain numpy views of the file's map) gives
    ``gguf.GGUFReader``'s fields and tensors: names, types, every part and every tensor's
    bytes (a quantized one included), and read-only tensor data as the memory map's."""
    import gguf

    from vllm.model_executor.model_loader.gguf_checks import read_gguf

    path = str(tmp_path / "tok.gguf")
    _write_tiny_llama_gguf(path, ffn_down_type="Q4_K", tokenizer="llama")
    want, got = gguf.GGUFReader(path), read_gguf(path)
    assert list(got.fields) == list(want.fields)
    for name, field in want.fields.items():
        other = got.fields[name]
        assert (other.types, other.data, other.offset) == (field.types, field.data, field.offset)
        assert len(other.parts) == len(field.parts), name
        for a, b in zip(field.parts, other.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert [t.name for t in got.tensors] == [t.name for t in want.tensors]
    for a, b in zip(want.tensors, got.tensors):
        assert (b.tensor_type, list(b.shape), b.data_offset) == (
            a.tensor_type, list(a.shape), a.data_offset
        ), a.name  # fmt: skip
        assert b.data.dtype == a.data.dtype and np.array_equal(b.data, a.data), a.name
        assert type(b.data) is np.ndarray and not b.data.flags.writeable


@pytest.mark.parametrize("keep", [0.5, 0.0005, 0.0])
def test_truncated_file_is_refused_naming_it(tmp_path, keep):
    from vllm.config import ModelConfig

    whole = tmp_path / "whole.gguf"
    _write_tiny_llama_gguf(str(whole))
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.gguf' is not a readable GGUF file .*truncated"):
        ModelConfig(model=str(cut), skip_tokenizer_init=True)


def test_split_gguf_shards_are_refused_with_the_merge_hint(tmp_path):
    from vllm.config import ModelConfig

    _write_tiny_llama_gguf(str(tmp_path / "m.gguf"), split_max_tensors=6)
    shards = sorted(p.name for p in tmp_path.glob("m-*.gguf"))
    assert shards == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    for k, name in enumerate(shards, 1):
        with pytest.raises(ValueError, match=rf"{name}' is shard {k} of a split GGUF of 2 "):
            ModelConfig(model=str(tmp_path / name), skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=r"llama-gguf-split --merge"):
        ModelConfig(model=str(tmp_path / shards[0]), skip_tokenizer_init=True)


@pytest.mark.parametrize("qtype", ["Q8_K", "F64"])
def test_tensor_type_that_cannot_be_dequantized_is_refused(tmp_path, qtype):
    from vllm.config import ModelConfig

    path = str(tmp_path / f"{qtype}.gguf")
    _write_tiny_llama_gguf(path, ffn_down_type=qtype)
    want = rf"holds tensors of type {qtype} \(e\.g\. 'blk\.0\.ffn_down\.weight'\) .*'Q4_K'"
    with pytest.raises(ValueError, match=want):
        ModelConfig(model=path, skip_tokenizer_init=True)


def test_a_tokenizer_transformers_cannot_build_is_reported_with_its_reason(tmp_path):
    from vllm.transformers_utils.tokenizer import load_tokenizer

    rwkv, bare = str(tmp_path / "rwkv.gguf"), str(tmp_path / "bare.gguf")
    _write_tiny_llama_gguf(rwkv, tokenizer="rwkv")
    _write_tiny_llama_gguf(bare)
    with pytest.raises(ValueError) as err:
        load_tokenizer(rwkv)
    assert "transformers cannot build the file's tokenizer" in str(err.value)
    assert "tokenizer 'rwkv'" in str(err.value)  # transformers' own reason
    assert "has no tokenizer in its metadata" not in str(err.value)
    with pytest.raises(ValueError, match=r"bare\.gguf' \(ValueError: the file has no tokenizer in"):
        load_tokenizer(bare)


@pytest.mark.parametrize("arch", ["granite", "smollm3"])
def test_an_architecture_transformers_cannot_read_from_gguf_names_the_supported_ones(
    tmp_path, arch
):
    """A GGUF file of an architecture transformers' GGUF reader lacks (Granite, SmolLM3;
    both load from Hugging Face directories) is refused with the GGUF architectures that
    load, as the ones transformers reads but the engine does not load from GGUF are."""
    import gguf

    from vllm.engine.arg_utils import EngineArgs

    path = str(tmp_path / f"{arch}.gguf")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((VOCAB, HIDDEN), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError) as err:
        EngineArgs(model=path).create_engine_config()
    assert f"architecture {arch}" in str(err.value), err.value
    assert "GGUF files load for ['LlamaForCausalLM'" in str(err.value), err.value


def test_a_gguf_file_under_another_name_is_recognised_by_its_magic_bytes(tmp_path):
    import shutil

    import torch

    from vllm.config import ModelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    named = tmp_path / "m.gguf"
    _write_tiny_llama_gguf(str(named))
    other = tmp_path / "model.bin"
    shutil.copyfile(named, other)
    (tmp_path / "notes.txt").write_text("GGUX not a model")
    args = EngineArgs(model=str(other), quantization="gguf", skip_tokenizer_init=True)
    config = args.create_engine_config().model_config
    assert config.is_gguf and config.load_format == "gguf"
    assert config.hf_config.architectures == ["LlamaForCausalLM"]
    assert config.max_model_len == 64  # llama.context_length
    want = dict(get_model(ModelConfig(model=str(named)), "cpu").named_parameters())
    got = dict(get_model(config, "cpu").named_parameters())
    assert want.keys() == got.keys() and len(got) > 5
    assert all(torch.equal(got[n], want[n]) for n in want)
    with pytest.raises(ValueError, match=r"notes\.txt' has no config\.json"):
        ModelConfig(model=str(tmp_path / "notes.txt"))
    missing = EngineArgs(model=str(tmp_path / "absent.gguf"), quantization="gguf")
    with pytest.raises(ValueError, match=r"absent\.gguf' does not exist"):
        missing.create_engine_config()
