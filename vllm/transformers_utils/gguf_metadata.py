"""The config and tokenizer of a GGUF file, converted by transformers once and kept on disk.

transformers reads a GGUF file's config and its tokenizer by parsing all of the file's
metadata in Python, the tokenizer's vocabulary and merges included: about 5 s for the config
and 8 s for the tokenizer of SmolLM2 (49,152 tokens) on a 2-core machine, paid by every
process that starts an engine on the file. The first process saves what transformers made
(``save_pretrained``: config.json, and tokenizer.json with its companions when the file
carries a tokenizer) under ``$VLLM_CACHE_ROOT/gguf_metadata/<key>``; later processes load
that directory, which transformers reads in well under a second. A fast tokenizer saved
and reloaded this way encodes and decodes identically. A file's ``rope_freqs`` tensor
(llama.cpp's per-frequency RoPE divisors, which transformers ignores) is kept beside them
as ``rope_freqs.json``: :func:`rope_freq_factors`; so are the ``{arch}.rope.scaling.*``
keys (a linear or YaRN scaling, which transformers' GGUF reader also drops) as
``rope_scaling.json``: :func:`rope_scaling`. The config's ``head_dim`` is the file's
``{arch}.attention.key_length`` where transformers left its class default (qwen3).
Before transformers reads it, the file is checked
(:mod:`vllm.model_executor.model_loader.gguf_checks`): a truncated or corrupt file, a shard
of a split GGUF and tensor types that cannot be dequantized are refused, naming the file.

The key is the file's absolute path, size and modification time, the transformers
version and ``FORMAT`` (what this module writes), so a changed or replaced file is
converted again. Nothing depends on the cache
being writable: when it is not, the file is converted once per process into a temporary
directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading

_LOCK = threading.Lock()
TOKENIZER_MARKER = "tokenizer_config.json"
ROPE_FREQS_FILE = "rope_freqs.json"
ROPE_SCALING_FILE = "rope_scaling.json"
TOKENIZER_ERROR_FILE = "tokenizer_error.txt"
# 2: rope_freqs.json; 3: rope_scaling.json and head_dim from key_length; 4: the file checks;
# 5: tokenizer_error.txt; 6: rope_scaling.json with YaRN's keys
FORMAT = 6
# key -> temporary directory, for a process whose cache root cannot be written
_PRIVATE: dict[str, str] = {}


def cache_root() -> str:
    """``VLLM_CACHE_ROOT`` (default ``~/.cache/vllm``, upstream's default location)."""
    from vllm import envs

    return envs.VLLM_CACHE_ROOT or os.path.join(os.path.expanduser("~"), ".cache", "vllm")


def _key(path: str) -> str:
    import transformers

    st = os.stat(path)
    src = json.dumps(
        [os.path.abspath(path), st.st_size, st.st_mtime_ns, transformers.__version__, FORMAT]
    )
    return hashlib.sha256(src.encode()).hexdigest()[:24]


def _convert(path: str, out: str) -> None:
    """Write the config (and the tokenizer, if the file has one) of GGUF ``path`` to ``out``.

    Raises:
        ValueError: a truncated or corrupt file, a shard of a split GGUF or a tensor type
            that cannot be dequantized (``gguf_checks.open_checked_gguf``); whatever
            transformers raises when the file's config cannot be read.
    """
    from transformers import AutoConfig, AutoTokenizer

    from vllm.model_executor.model_loader.gguf_checks import open_checked_gguf
    from vllm.model_executor.model_loader.gguf_loader import (
        gguf_key_length,
        gguf_rope_freq_factors,
        gguf_rope_scaling,
    )

    # once: the file checks, then what transformers' reader leaves out
    reader = open_checked_gguf(path)
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    key_length = gguf_key_length(reader)
    if key_length is not None and getattr(config, "head_dim", key_length) != key_length:
        # transformers' GGUF reader maps attention.key_length for some architectures
        # only (not qwen3): its config then keeps the class default (Qwen3's 128)
        config.head_dim = key_length
    config.save_pretrained(out)
    _keep_json(out, ROPE_FREQS_FILE, gguf_rope_freq_factors(reader))
    _keep_json(out, ROPE_SCALING_FILE, gguf_rope_scaling(reader))
    try:
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    except Exception as e:  # kept for load_tokenizer to report when a tokenizer is asked for
        reason = (
            f"transformers cannot build the file's tokenizer ({type(e).__name__}: {e})"
            if "tokenizer.ggml.model" in reader.fields
            else "the file has no tokenizer in its metadata"
        )
        with open(os.path.join(out, TOKENIZER_ERROR_FILE), "w") as fh:
            fh.write(reason)
        return
    tok.save_pretrained(out)


def gguf_metadata_dir(path: str) -> str:
    """A Hugging Face directory with the config (and tokenizer, when present) of the GGUF
    file ``path``, converted by transformers on first use and cached (module docstring).

    Returns:
        the cached directory, or (when the cache root cannot be written) a temporary one,
        made once per process and file.

    Raises:
        OSError: ``path`` does not exist.
        ValueError: a file :mod:`vllm.model_executor.model_loader.gguf_checks` refuses;
            whatever transformers raises for a config it cannot read (then nothing is
            cached).
    """
    key = _key(path)
    target = os.path.join(cache_root(), "gguf_metadata", key)
    if _complete(target):
        return target
    with _LOCK:
        if _complete(target):
            return target
        if key in _PRIVATE:
            return _PRIVATE[key]
        tmp = f"{target}.tmp{os.getpid()}"
        try:
            os.makedirs(tmp, exist_ok=True)
        except OSError:  # read-only cache root: convert into a private temporary directory
            import tempfile

            tmp = tempfile.mkdtemp(prefix="vllm_gguf_metadata_")
            _convert(path, tmp)
            _PRIVATE[key] = tmp
            return tmp
        try:
            _convert(path, tmp)
            os.rename(tmp, target)
        except OSError:  # another process finished first: use its copy
            shutil.rmtree(tmp, ignore_errors=True)
            if not _complete(target):
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target


def _complete(meta_dir: str) -> bool:
    return os.path.isfile(os.path.join(meta_dir, "config.json"))


def rope_freq_factors(meta_dir: str) -> list[float] | None:
    """The GGUF file's ``rope_freqs`` divisors (float32 values, head_dim / 2 of them) that
    :func:`gguf_metadata_dir` kept in ``meta_dir``, or None when the file had none."""
    return _kept_json(meta_dir, ROPE_FREQS_FILE)


def rope_scaling(meta_dir: str) -> dict | None:
    """The GGUF file's RoPE scaling keys (``gguf_loader.gguf_rope_scaling``) that
    :func:`gguf_metadata_dir` kept in ``meta_dir``, or None when the file had none."""
    return _kept_json(meta_dir, ROPE_SCALING_FILE)


def _keep_json(meta_dir: str, name: str, value) -> None:
    """Write ``value`` as the JSON file ``name`` in ``meta_dir`` (nothing for None), for
    :func:`_kept_json` to read back."""
    if value is not None:
        with open(os.path.join(meta_dir, name), "w") as fh:
            json.dump(value, fh)


def _kept_json(meta_dir: str, name: str):
    """The JSON value of the file ``name`` that :func:`_convert` wrote in ``meta_dir``, or
    None when it wrote none."""
    path = os.path.join(meta_dir, name)
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def has_tokenizer(meta_dir: str) -> bool:
    """Whether :func:`gguf_metadata_dir` found a tokenizer in the file."""
    return os.path.isfile(os.path.join(meta_dir, TOKENIZER_MARKER))


def tokenizer_error(meta_dir: str) -> str:
    """Why :func:`gguf_metadata_dir` made no tokenizer of the file: it has no
    ``tokenizer.ggml.*`` metadata, or transformers' error building it (for example a
    ``tokenizer.ggml.model`` transformers does not convert)."""
    path = os.path.join(meta_dir, TOKENIZER_ERROR_FILE)
    if not os.path.isfile(path):
        return "the file has no tokenizer in its metadata"
    with open(path) as fh:
        return fh.read()
