"""``--speculative-config``: upstream vLLM's one JSON flag for speculative decoding, mapped
onto this engine's separate speculative flags.

Accepted keys (upstream's names), for the two proposers this engine has:

- n-gram prompt lookup: ``{"method": "ngram", "num_speculative_tokens": 4,
  "prompt_lookup_max": 4, "prompt_lookup_min": 1}``;
- a draft model: ``{"model": "/path/to/draft", "num_speculative_tokens": 4}`` (``method``
  absent or ``"draft_model"``);
- either: ``max_model_len`` (the draft's context limit), ``disable_by_batch_size``,
  ``draft_tensor_parallel_size`` (the target's tensor-parallel size, the only one allowed).

A value given both here and as its separate flag (``--speculative-model`` and friends)
is refused, so no setting is silently overridden.
"""

from __future__ import annotations

import json
from typing import Any

# speculative-config key -> EngineArgs field
KEY_TO_FIELD = {
    "num_speculative_tokens": "num_speculative_tokens",
    "prompt_lookup_max": "ngram_prompt_lookup_max",
    "prompt_lookup_min": "ngram_prompt_lookup_min",
    "max_model_len": "speculative_max_model_len",
    "disable_by_batch_size": "speculative_disable_by_batch_size",
    "draft_tensor_parallel_size": "speculative_draft_tensor_parallel_size",
}
METHODS = ("ngram", "draft_model")


def speculative_fields(config: dict | str | None) -> dict[str, Any]:
    """The EngineArgs fields ``config`` sets (empty for None).

    Args:
        config: a dict, or its JSON text (the CLI value).

    Returns:
        ``{"speculative_model": ..., "num_speculative_tokens": ..., ...}`` with only the
        fields the config gives; ``speculative_model`` is "[ngram]" for the n-gram method.

    Raises:
        ValueError: text that is not a JSON object, an unknown key or method (naming the
            supported ones), ngram with a ``model``, or a draft without ``model``.
    """
    if config is None:
        return {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative_config is not valid JSON ({e}): {config!r}.") from None
    if not isinstance(config, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {config!r}.")
    unknown = sorted(set(config) - set(KEY_TO_FIELD) - {"method", "model"})
    if unknown:
        raise ValueError(
            f"speculative_config has unsupported keys {unknown}; supported: "
            f"{sorted([*KEY_TO_FIELD, 'method', 'model'])}."
        )
    method = config.get("method") or "draft_model"
    if method not in METHODS:
        raise ValueError(
            f"speculative_config method {method!r} is not supported; supported: {list(METHODS)}."
        )
    model = config.get("model")
    if method == "ngram" and model is not None:
        raise ValueError(f"speculative_config method 'ngram' takes no model, got {model!r}.")
    if method == "draft_model" and not model:
        raise ValueError(
            "speculative_config needs a 'model' (a draft model path) or method 'ngram'."
        )
    out: dict[str, Any] = {"speculative_model": "[ngram]" if method == "ngram" else model}
    for key, name in KEY_TO_FIELD.items():
        if config.get(key) is not None:
            out[name] = config[key]
    return out


def resolve_speculative(args: Any) -> dict[str, Any]:
    """The speculative settings of ``args`` (an EngineArgs): its separate fields
    (``speculative_model`` and those of :data:`KEY_TO_FIELD`) with
    ``args.speculative_config`` applied; ``args`` itself is not changed.

    Raises:
        ValueError: see :func:`speculative_fields`, or a field set both ways.
    """
    names = ["speculative_model", *KEY_TO_FIELD.values()]
    values = {name: getattr(args, name) for name in names}
    fields = speculative_fields(args.speculative_config)
    both = [name for name in fields if values[name] is not None]
    if both:
        flags = ", ".join("--" + name.replace("_", "-") for name in both)
        raise ValueError(f"speculative_config and {flags} both set {both}: give each once.")
    values.update(fields)
    return values
