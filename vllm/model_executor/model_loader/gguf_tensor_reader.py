"""A GGUF reader for loading weights: the tensor table and the scalar metadata, with the
metadata arrays (a tokenizer's vocabulary, scores, token types and merges) skipped.

``gguf.GGUFReader`` parses every metadata array item by item, making two numpy views per
string: for a file carrying SmolLM2's tokenizer (49,152 tokens and 48,900 merges) that is
about 1.6 s of each engine start on a 2-core machine, though the weight loader needs only
``general.architecture``, ``general.alignment`` and the tensors. Here an array is stepped
over by reading its items' lengths (about 0.05 s for the same file); everything else is
``gguf.GGUFReader``'s own parsing, so the tensors (names, types, shapes, data views) are
the ones :func:`~vllm.model_executor.model_loader.gguf_checks.read_gguf` gives.

The format (GGUF v2 and v3, llama.cpp's ``docs/gguf.md``): after the header, each
metadata entry is a key (u64 length + UTF-8 bytes), a u32 value type and the value; an
array value is a u32 item type, a u64 item count and the items, a string item being a u64
length and its bytes.
"""

from __future__ import annotations

import functools
import sys


def read_gguf_tensors(path: str):
    """A ``gguf.GGUFReader`` of ``path`` whose ``fields`` hold the scalar and string
    metadata only (no array-valued key), with the same ``tensors`` as a full read.

    A file of the other byte order is read in full (``gguf.GGUFReader``'s own parse).

    Raises:
        ValueError: not a GGUF file, an unsupported version or value type (as
            ``gguf.GGUFReader``), or a metadata array that runs past the end of the file.
    """
    return _tensor_reader_class()(path)


@functools.cache
def _tensor_reader_class():
    import numpy as np
    from gguf import GGUFValueType
    from gguf.gguf_reader import ReaderField

    from vllm.model_executor.model_loader.gguf_checks import plain_array_reader_class

    base = plain_array_reader_class()
    item_sizes = {int(t): np.dtype(dt).itemsize for t, dt in base.gguf_scalar_to_np.items()}

    class TensorTableGGUFReader(base):
        """``gguf.GGUFReader`` that steps over array-valued metadata (module docstring)."""

        def _build_fields(self, offs: int, count: int) -> int:
            if self.byte_order == "S":  # the other byte order: the full parse
                return super()._build_fields(offs, count)
            buf = memoryview(self.data)
            for _ in range(count):
                orig_offs = offs
                key_len, key = self._get_str(offs)
                offs += int(key_len.nbytes + key.nbytes)
                raw_type = self._get(offs, np.uint32)
                offs += int(raw_type.nbytes)
                if int(raw_type[0]) == GGUFValueType.ARRAY:
                    offs = _skip_array(buf, offs)
                    continue
                size, parts, idxs, types = self._get_field_parts(offs, raw_type[0])
                self._push_field(
                    ReaderField(
                        orig_offs,
                        str(bytes(key), encoding="utf-8"),
                        [key_len, key, raw_type, *parts],
                        [i + 3 for i in idxs],
                        types,
                    ),
                    skip_sum=True,
                )
                offs += size
            return offs

    def _skip_array(buf: memoryview, offs: int) -> int:
        """The offset just past the array value that starts at ``offs``."""
        end = len(buf)
        item_type = _u(buf, offs, 4)
        count = _u(buf, offs + 4, 8)
        offs += 12
        if item_type == GGUFValueType.STRING:
            for _ in range(count):  # each item moves on 8 bytes at least: bounded by end
                offs += 8 + _u(buf, offs, 8)
                if offs > end:
                    break
        elif item_type == GGUFValueType.ARRAY:
            for _ in range(count):
                offs = _skip_array(buf, offs)
        elif item_type in item_sizes:
            offs += count * item_sizes[item_type]
        else:
            raise ValueError(f"Unknown/unhandled GGUF array item type {item_type}")
        if offs > end:
            raise ValueError(f"a GGUF metadata array runs past the end of the file ({offs})")
        return offs

    return TensorTableGGUFReader


def _u(buf: memoryview, offs: int, size: int) -> int:
    """The unsigned integer of ``size`` bytes at ``offs``, in this host's byte order."""
    return int.from_bytes(buf[offs : offs + size], sys.byteorder)
