"""Tokenizer loading through transformers (HF directory or the tokenizer inside a .gguf)."""

from __future__ import annotations

import functools
import os


def get_tokenizer(path: str, mode: str = "auto", trust_remote_code: bool = False):
    """The tokenizer for ``path``, cached per process by path, modification time and
    options (parsing a GGUF's tokenizer metadata takes seconds); see :func:`load_tokenizer`."""
    mtime = os.path.getmtime(path) if os.path.exists(path) else 0.0
    return _cached(path, mtime, mode, trust_remote_code)


@functools.lru_cache(maxsize=8)
def _cached(path: str, mtime: float, mode: str, trust_remote_code: bool):
    return load_tokenizer(path, mode, trust_remote_code)


def load_tokenizer(path: str, mode: str = "auto", trust_remote_code: bool = False):
    """A transformers tokenizer for ``path``.

    Args:
        path: a Hugging Face directory, or a .gguf file (transformers reads the tokenizer and
            chat template stored in its metadata, once per file and then from disk:
            :mod:`vllm.transformers_utils.gguf_metadata`).
        mode: "auto" (a fast tokenizer when available) or "slow" (``use_fast=False``).
        trust_remote_code: passed to ``AutoTokenizer.from_pretrained``.
    Raises:
        ValueError: when no tokenizer can be loaded (message names the path).
    """
    from transformers import AutoTokenizer

    from vllm.model_executor.model_loader.gguf_checks import is_gguf_file
    from vllm.transformers_utils.gguf_metadata import (
        gguf_metadata_dir,
        has_tokenizer,
        tokenizer_error,
    )

    kw = dict(use_fast=mode != "slow", trust_remote_code=trust_remote_code)
    try:
        if is_gguf_file(path):
            meta = gguf_metadata_dir(path)
            if not has_tokenizer(meta):
                raise ValueError(tokenizer_error(meta))
            return AutoTokenizer.from_pretrained(meta, **kw)
        return AutoTokenizer.from_pretrained(path, **kw)
    except Exception as e:  # transformers raises many types here
        raise ValueError(
            f"Could not load a tokenizer from {path!r} ({type(e).__name__}: {e}); "
            "pass tokenizer=..., or skip_tokenizer_init=True with token-id prompts."
        ) from e
