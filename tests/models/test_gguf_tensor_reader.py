"""The weight loader's GGUF reader (vllm/model_executor/model_loader/gguf_tensor_reader.py)
steps over array-valued metadata; its tensors and other fields equal a full
``gguf.GGUFReader`` parse (``gguf_checks.read_gguf``)."""

import numpy as np
import pytest

from vllm.model_executor.model_loader.gguf_checks import read_gguf
from vllm.model_executor.model_loader.gguf_tensor_reader import read_gguf_tensors


def _write(path: str) -> None:
    """Every metadata value kind before the tensors: strings, scalars, arrays of numbers,
    of strings (with an empty one) and of arrays; an F32, an F16 and a Q8_0 tensor."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("a.string", "héllo")
    writer.add_uint32("a.u32", 7)
    writer.add_float32("a.f32", 0.5)
    writer.add_bool("a.bool", True)
    writer.add_array("a.ints", [1, -2, 3])
    writer.add_array("a.floats", [0.25, 1.5])
    writer.add_array("a.strings", ["x", "", "yz" * 100])
    writer.add_array("a.nested", [[1, 2], [3]])
    writer.add_uint64("after.arrays", 2**40)
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((4, 8)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    writer.add_tensor("q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _assert_same_but_arrays(path: str) -> set:
    full, tensors_only = read_gguf(path), read_gguf_tensors(path)
    assert [t.name for t in tensors_only.tensors] == [t.name for t in full.tensors]
    for a, b in zip(full.tensors, tensors_only.tensors):
        assert (a.tensor_type, list(a.shape), a.data_offset) == (
            b.tensor_type, list(b.shape), b.data_offset
        )  # fmt: skip
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)
    arrays = {k for k, f in full.fields.items() if f.types[0].name == "ARRAY"}
    assert list(tensors_only.fields) == [k for k in full.fields if k not in arrays]
    for key, field in tensors_only.fields.items():
        assert field.contents() == full.fields[key].contents(), key
    return arrays


def test_every_value_kind(tmp_path):
    path = str(tmp_path / "kinds.gguf")
    _write(path)
    arrays = _assert_same_but_arrays(path)
    assert arrays == {"a.ints", "a.floats", "a.strings", "a.nested"}
    reader = read_gguf_tensors(path)
    assert reader.fields["after.arrays"].contents() == 2**40
    assert reader.fields["a.string"].contents() == "héllo"


def test_a_file_with_a_tokenizer(tiny_llama_gguf):
    """A tiny GGUF carries SmolLM2's tokenizer arrays (49,152 tokens and their merges)."""
    arrays = _assert_same_but_arrays(tiny_llama_gguf)
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= arrays


def test_an_array_past_the_end_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    _write(str(path))
    data = path.read_bytes()
    cut = data.index(b"yz" * 100) + 10  # inside the string array's last item
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="past the end of the file"):
        read_gguf_tensors(str(path))
