"""The pooler a Sentence Transformers checkpoint declares, as upstream reads it.

A checkpoint saved by Sentence Transformers lists its modules in ``modules.json``: the
transformer, a ``Pooling`` module (its ``config.json`` in the module's folder, usually
``1_Pooling``, says which ``pooling_mode_*`` is on) and, for unit vectors, a
``Normalize`` module. Upstream uses these as the embedding pooler's defaults (the
``--override-pooler-config`` keys win over them): ``pooling_mode_lasttoken`` is ``LAST``,
``pooling_mode_mean_tokens`` ``MEAN``, ``pooling_mode_cls_token`` ``CLS``, and the vectors
are normalized only when a ``Normalize`` module is listed.
"""

from __future__ import annotations

import json
import logging
import os

logger = logging.getLogger(__name__)

_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


def _module(modules: list, kind: str) -> dict | None:
    """The first entry of ``modules`` whose type is Sentence Transformers' ``kind`` module
    (``sentence_transformers.models.Pooling`` or a newer path ending in the same name)."""
    for item in modules:
        typ = str(item.get("type", "")) if isinstance(item, dict) else ""
        if typ.startswith("sentence_transformers.") and typ.rsplit(".", 1)[-1] == kind:
            return item
    return None


def sentence_transformers_pooler(model: str, type_given: bool = False) -> dict | None:
    """The pooler ``model`` (a checkpoint directory) declares in its Sentence Transformers
    files: ``{"pooling_type": ..., "normalize": ...}``; None when it has no
    ``modules.json`` with a ``Pooling`` module (a GGUF file, a plain checkpoint).
    ``pooling_type`` is None when the Pooling config turns no mode on, or when
    ``type_given`` (the override names the pooling type, so the file's is not used).

    Raises:
        ValueError: an unreadable ``modules.json`` or Pooling config, or (unless
            ``type_given``) a pooling this engine does not implement (max, weighted mean,
            several modes concatenated), naming it and ``--override-pooler-config``.
    """
    path = os.path.join(model, "modules.json")
    if not os.path.isfile(path):
        return None
    modules = _read_json(path)
    pooling = _module(modules if isinstance(modules, list) else [], "Pooling")
    if pooling is None:
        return None
    config = _read_json(os.path.join(model, str(pooling.get("path", "")), "config.json"))
    config = config if isinstance(config, dict) else {}
    on = [key for key, value in config.items() if key.startswith("pooling_mode") and value is True]
    if not type_given and (len(on) > 1 or any(key not in _MODES for key in on)):
        raise ValueError(
            f"{model}: its Sentence Transformers pooling ({' + '.join(on)}) is not "
            "implemented (one of pooling_mode_lasttoken, pooling_mode_mean_tokens, "
            "pooling_mode_cls_token is); choose a pooling with --override-pooler-config "
            '\'{"pooling_type": "LAST"|"MEAN"|"CLS"}\'.'
        )
    found = {
        "pooling_type": _MODES[on[0]] if on and not type_given else None,
        "normalize": _module(modules, "Normalize") is not None,
    }
    logger.info("Sentence Transformers pooler of %s: %s", model, found)
    return found


def _read_json(path: str):
    """The JSON document at ``path``.

    Raises:
        ValueError: missing or not JSON, naming the file.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the Sentence Transformers file {path}: {e}") from None
