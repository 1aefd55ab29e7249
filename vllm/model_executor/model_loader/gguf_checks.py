"""Checks of a GGUF file made when its config is first read, before any weight is loaded.

A file that cannot be loaded is refused at start-up with a message naming it and why:

- a truncated or corrupt file (``gguf.GGUFReader`` cannot parse its header, metadata or
  tensor table, or the tensor data runs past the end of the file);
- one shard of a split GGUF (llama.cpp's ``-00001-of-0000N`` files, metadata key
  ``split.count``): only single-file GGUF checkpoints load, as in upstream vLLM;
- a tensor type that ``gguf.quants.dequantize`` does not implement (``Q8_K``, ``F64``, ...).

:func:`open_checked_gguf` runs them all; ``gguf_metadata`` calls it once per file version
(the result is cached with the converted config, so a cached file is not read again).
:func:`is_gguf_file` is how every part of the engine recognises a GGUF checkpoint.
:func:`read_gguf` is how the engine opens one.
"""

from __future__ import annotations

import functools
import os

GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: str) -> bool:
    """Whether ``path`` is a GGUF checkpoint file, as upstream decides: a file whose name
    ends in ``.gguf``, or any file that starts with the GGUF magic bytes (a GGUF saved
    under another name). Directories and missing paths are not."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    if path.endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def read_gguf(path: str):
    """``gguf.GGUFReader(path)`` whose arrays (metadata parts, tensor data) are plain numpy
    views of the file's read-only memory map instead of ``np.memmap`` slices.

    The values are the same; what differs is the cost of the reader's per-item slicing, each
    of which makes a Python-level ``memmap.__array_finalize__`` call on a ``np.memmap``: a
    file carrying a tokenizer holds ~150k such items (SmolLM2's 49,152 tokens, their types
    and merges), about 3.4 s per read on a 2-core machine against 1.0 s here.
    """
    return plain_array_reader_class()(path)


@functools.cache
def plain_array_reader_class():
    """The class of :func:`read_gguf`'s readers (a ``gguf.GGUFReader`` subclass)."""
    import gguf
    import numpy as np

    class PlainArrayGGUFReader(gguf.GGUFReader):
        """GGUFReader whose ``data`` (assigned ``np.memmap(path)`` in its ``__init__``) is
        kept as an ``np.ndarray`` view of that map."""

        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._plain_data = value.view(np.ndarray)

    return PlainArrayGGUFReader


SPLIT_COUNT_KEY = "split.count"
SPLIT_NO_KEY = "split.no"


def open_checked_gguf(path: str):
    """The ``gguf.GGUFReader`` of the GGUF file ``path``, after the module's checks.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is unreadable (truncated or corrupt), a shard of a split GGUF,
            or holds tensor types that cannot be dequantized; the message names the file
            (and the shard, or the types with one tensor of each).
    """
    try:
        reader = read_gguf(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # ValueError, struct.error, IndexError ... from a damaged file
        raise ValueError(
            f"{path!r} is not a readable GGUF file ({type(e).__name__}: {e}); it may be "
            "truncated or corrupt."
        ) from e
    _check_not_split(reader, path)
    _check_tensor_types(reader, path)
    return reader


def _check_not_split(reader, path: str) -> None:
    """Refuse one shard of a split GGUF (``split.count`` > 1), naming the merge tool."""
    count = reader.fields.get(SPLIT_COUNT_KEY)
    if count is None or int(count.contents()) <= 1:
        return
    number = reader.fields.get(SPLIT_NO_KEY)
    shard = "" if number is None else f"shard {int(number.contents()) + 1} of "
    raise ValueError(
        f"{path!r} is {shard}a split GGUF of {int(count.contents())} files; only "
        "single-file GGUF checkpoints load. Merge the shards into one file first "
        "(llama.cpp: llama-gguf-split --merge <first shard> <merged.gguf>)."
    )


def _check_tensor_types(reader, path: str) -> None:
    """Refuse tensor types that ``gguf.quants.dequantize`` does not implement (probed on
    one row of one tensor of each type), naming them with a tensor of each."""
    first_of_type: dict = {}
    for tensor in reader.tensors:
        first_of_type.setdefault(tensor.tensor_type, tensor)
    refused = {
        qtype.name: tensor.name
        for qtype, tensor in first_of_type.items()
        if not _dequantizes(tensor.data.reshape(-1, tensor.data.shape[-1])[:1], qtype)
    }
    if refused:
        shown = ", ".join(f"{t} (e.g. {n!r})" for t, n in sorted(refused.items()))
        raise ValueError(
            f"{path!r} holds tensors of type {shown} that cannot be dequantized; supported "
            f"GGUF tensor types: {supported_tensor_types()}."
        )


def _dequantizes(data, qtype) -> bool:
    import gguf

    try:
        gguf.quants.dequantize(data, qtype)
    except NotImplementedError:
        return False
    return True


def supported_tensor_types() -> list[str]:
    """Names of the GGUF tensor types ``gguf.quants.dequantize`` implements (each probed
    on one zero block of its size)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    names = []
    for qtype in GGMLQuantizationType:
        if qtype not in GGML_QUANT_SIZES:
            continue
        block, size = GGML_QUANT_SIZES[qtype]
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = np.zeros(block, dtype=np.float32 if size == 4 else np.float16)
        else:
            data = np.zeros((1, size), dtype=np.uint8)
        if _dequantizes(data, qtype):
            names.append(qtype.name)
    return names
