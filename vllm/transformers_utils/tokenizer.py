"""Tokenizer loading through transformers (HF directory or the tokenizer inside a .gguf)."""

from __future__ import annotations

import functools
import os


def get_tokenizer(path: str):
    """The tokenizer for ``path``, cached per process by path and modification time
    (parsing a GGUF's tokenizer metadata takes seconds); see :func:`load_tokenizer`."""
    mtime = os.path.getmtime(path) if os.path.exists(path) else 0.0
    return _cached(path, mtime)


@functools.lru_cache(maxsize=8)
def _cached(path: str, mtime: float):
    return load_tokenizer(path)


def load_tokenizer(path: str):
    """A transformers tokenizer for ``path``.

    Args:
        path: a Hugging Face directory, or a .gguf file (transformers reads the tokenizer and
            chat template stored in its metadata, once per file and then from disk:
            :mod:`vllm.transformers_utils.gguf_metadata`).
    Raises:
        ValueError: when no tokenizer can be loaded (message names the path).
    """
    from transformers import AutoTokenizer

    from vllm.transformers_utils.gguf_metadata import gguf_metadata_dir, has_tokenizer

    try:
        if os.path.isfile(path) and path.endswith(".gguf"):
            meta = gguf_metadata_dir(path)
            if not has_tokenizer(meta):
                raise ValueError("the file has no tokenizer in its metadata")
            return AutoTokenizer.from_pretrained(meta)
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # transformers raises many types here
        raise ValueError(
            f"Could not load a tokenizer from {path!r} ({type(e).__name__}: {e}); "
            "pass tokenizer=..., or skip_tokenizer_init=True with token-id prompts."
        ) from e
