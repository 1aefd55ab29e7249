"""Models named by Hugging Face Hub repository (``vllm serve Qwen/Qwen2.5-0.5B-Instruct``).

A model (or tokenizer) that is not a local path but has the shape of a repository id
("org/name" or "name") is fetched with ``huggingface_hub.snapshot_download`` into the
Hub's cache (``download_dir`` when given, else ``HF_HUB_CACHE`` / ``HF_HOME``), at
``revision`` when given, and the engine reads the snapshot directory it returns. Only the
files the engine reads are fetched (:data:`HUB_FILES`: config and generation config,
safetensors weights and their index, tokenizer files, chat templates), as upstream skips
the other weight formats when safetensors are there. ``HF_HUB_OFFLINE=1`` reads the cache
alone (huggingface_hub's own switch); ``--hf-token``, ``HF_TOKEN`` or ``hf auth login``
give access to gated repositories. A local path always wins, and with it ``revision`` and
``download_dir`` are logged as ignored.
"""

from __future__ import annotations

import logging
import os
import re

logger = logging.getLogger(__name__)

# The files of a repository the engine reads (fnmatch patterns for snapshot_download).
HUB_FILES = [
    "*.json",  # config.json, generation_config.json, tokenizer files, safetensors index
    "*.safetensors",
    "*.model",  # sentencepiece tokenizers
    "*.tiktoken",
    "*.txt",  # merges.txt, vocab.txt
    "*.jinja",  # chat templates kept beside the tokenizer config
]
# A repository id: an optional owner and a name, of letters, digits, "-", "_" and ".".
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def is_repo_id(name: str) -> bool:
    """Whether ``name`` (not an existing path) has the shape of a Hub repository id; a
    .gguf name and anything starting with ".", "/" or "~" never does."""
    return bool(_REPO_ID.match(name)) and not name.endswith(".gguf") and ".." not in name


def resolve_model_path(
    name: str,
    revision: str | None = None,
    download_dir: str | None = None,
    what: str = "model",
    token: str | bool | None = None,
) -> str:
    """``name`` itself when it is a local path or not a repository id (the model config
    reports a missing path), else the local snapshot directory of that Hub repository
    (module doc).

    Args:
        name: the ``model`` (or ``tokenizer``) argument as given.
        revision: a branch, tag or commit of the repository (None: its main branch).
        download_dir: the Hub cache directory to use (None: huggingface_hub's default).
        what: the argument's name, for messages.
        token: the Hub token (``--hf-token``): a string, True for the stored login, None
            for huggingface_hub's default (HF_TOKEN, then the stored login).

    Raises:
        ValueError: ``name`` is a repository id that could not be fetched or found in the
            cache (offline), naming it, the revision and huggingface_hub's reason.
    """
    if os.path.exists(name) or not is_repo_id(name):
        for flag, value in (("revision", revision), ("download_dir", download_dir)):
            if value is not None and what == "model":
                logger.warning(
                    "%s=%r is ignored: the model is read from the local path %r.",
                    flag, value, name,
                )  # fmt: skip
        return name
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id=name, revision=revision, cache_dir=download_dir, allow_patterns=HUB_FILES,
            token=token,
        )  # fmt: skip
    except Exception as e:  # huggingface_hub's errors: missing, gated, offline, network
        at = f" at revision {revision!r}" if revision else ""
        raise ValueError(
            f"{what} {name!r} is not a local path, and Hugging Face Hub repository "
            f"{name!r}{at} could not be fetched: {type(e).__name__}: {e}"
        ) from e
    logger.info("%s %s%s: %s", what, name, f"@{revision}" if revision else "", path)
    return path
