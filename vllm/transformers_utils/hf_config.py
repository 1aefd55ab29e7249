"""Hugging Face configs for the engine: read one from a checkpoint directory or a .gguf
file (cached per process; a GGUF's metadata becomes a transformers config), and apply
``--hf-overrides`` to it. :class:`vllm.config.ModelConfig` calls both.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)


def apply_hf_overrides(hf_config: Any, overrides: dict) -> None:
    """Set ``overrides`` on a loaded Hugging Face config, as upstream's ``--hf-overrides``:
    a dict value whose attribute is itself a config (``text_config``) updates it key by
    key; any other value replaces (or adds) the attribute. Each change is logged.
    ``rope_theta``, ``partial_rotary_factor`` and ``rope_scaling`` also update
    transformers 5's ``rope_parameters`` (which the rotary embedding reads first). A
    ``rope_scaling`` dict, or a flat ``rope_parameters`` dict (upstream's documented
    spelling for YaRN), replaces the scaling and keeps the model's ``rope_theta`` unless it
    names one, as transformers reads a config.json holding both (transformers 5 itself
    drops the theta when either is assigned).

    Raises:
        ValueError: a value the config refuses (transformers' type checks), naming it.
    """
    from vllm.model_executor.layers.rotary_embedding import get_rope_parameters

    for key, value in overrides.items():
        current = getattr(hf_config, key, None)
        if isinstance(value, dict) and hasattr(current, "to_dict"):
            apply_hf_overrides(current, value)
            continue
        logger.info("hf_overrides: %s = %r (was %r)", key, value, current)
        theta = get_rope_parameters(hf_config)["rope_theta"]
        if isinstance(value, dict):
            value = dict(value)  # the config may keep (and change) the dict it is given
        try:
            setattr(hf_config, key, value)
        except Exception as e:  # transformers' strict dataclass validation, among others
            raise ValueError(
                f"hf_overrides: {key}={value!r} is refused by the config ({e})."
            ) from None
        rope = getattr(hf_config, "rope_parameters", None)
        if isinstance(rope, dict) and key in ("rope_theta", "partial_rotary_factor"):
            rope[key] = value
        elif isinstance(rope, dict) and key == "rope_scaling" and isinstance(value, dict):
            rope.update(value)
            if "type" in value and "rope_type" not in value:
                rope["rope_type"] = value["type"]
            if rope.get("rope_theta") is None:
                rope["rope_theta"] = theta
        elif isinstance(rope, dict) and key == "rope_parameters" and isinstance(value, dict):
            if rope.get("rope_theta") is None and not any(
                isinstance(v, dict) for v in rope.values()
            ):
                rope["rope_theta"] = theta


def load_hf_config(model: str, trust_remote_code: bool = False):
    """Load a transformers config from an HF directory or a .gguf file (a private copy).

    Parsed configs are cached per process by path, modification time and
    ``trust_remote_code`` (a GGUF's metadata takes seconds to parse; a GGUF's config is also
    kept on disk: :mod:`vllm.transformers_utils.gguf_metadata`); each call returns a deep
    copy. ``trust_remote_code`` is passed to ``AutoConfig.from_pretrained`` (always
    explicitly, so transformers never asks on the terminal).

    Raises:
        ValueError: when the directory has no config.json or the file is not readable,
            when transformers cannot build the config (invalid JSON, a field its checks
            refuse: the message names the directory and transformers' reason), or when the
            config needs its own code (``auto_map``) and ``trust_remote_code`` is False
            (naming ``--trust-remote-code``).
    """
    import copy

    return copy.deepcopy(_load_hf_config_cached(model, _mtime(model), bool(trust_remote_code)))


def _mtime(path: str) -> float:
    target = path if os.path.isfile(path) else os.path.join(path, "config.json")
    return os.path.getmtime(target) if os.path.exists(target) else 0.0


@functools.lru_cache(maxsize=8)
def _load_hf_config_cached(model: str, mtime: float, trust_remote_code: bool):
    from transformers import AutoConfig

    from vllm.model_executor.model_loader.gguf_checks import is_gguf_file

    if is_gguf_file(model):
        from vllm.model_executor.layers.rotary_embedding import (
            set_freq_factors,
            set_gguf_rope_scaling,
        )
        from vllm.transformers_utils.gguf_metadata import (
            gguf_metadata_dir,
            rope_freq_factors,
            rope_scaling,
        )

        try:
            meta_dir = gguf_metadata_dir(model)
        except ValueError as e:  # transformers' "GGUF model with architecture X is not ..."
            if "architecture" not in str(e):
                raise
            from vllm.model_executor.models import GGUF_ARCHS

            raise ValueError(
                f"{e} ({model!r}); GGUF files load for {list(GGUF_ARCHS)}. Use the model's "
                "Hugging Face directory instead."
            ) from None
        cfg = AutoConfig.from_pretrained(meta_dir)
        factors = rope_freq_factors(meta_dir)
        if factors is not None:  # llama.cpp's rope_freqs (transformers drops them)
            set_freq_factors(cfg, factors)
        scaling = rope_scaling(meta_dir)
        if scaling is not None:  # {arch}.rope.scaling.* keys (transformers drops them too)
            set_gguf_rope_scaling(cfg, scaling)
        if not getattr(cfg, "architectures", None):
            from vllm.model_executor.models import architectures_of

            cfg.architectures = architectures_of(cfg) or [f"<{cfg.model_type}>"]
        return cfg
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"{model!r} has no config.json (expected a Hugging Face directory).")
    try:
        return AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if trust_remote_code or "trust_remote_code" not in str(e):
            raise
        raise ValueError(
            f"the config of {model!r} needs its own code (auto_map in config.json), which "
            "runs only with --trust-remote-code (LLM(..., trust_remote_code=True))."
        ) from None
    except Exception as e:  # transformers' own checks: strict dataclass fields, bad JSON, ...
        raise ValueError(_refused_config(model, e)) from e


def _refused_config(model: str, error: Exception) -> str:
    """One line for a config.json that transformers cannot build: the directory, the
    exception's type and the last line of its message (which names the field)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    detail = lines[-1] if lines else "(no message)"
    return (
        f"the config.json of {model!r} is refused by transformers "
        f"({type(error).__name__}: {detail})"
    )
