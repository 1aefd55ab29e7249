"""PoolerConfig: how a prompt's hidden states become its embedding.

A generative model served with ``--task embed`` (or ``--runner pooling``) returns, per
prompt, a vector pooled from its final hidden states (after the model's last norm), as
upstream serves decoder-only embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral):
``LAST`` token (the default), ``MEAN`` over the prompt or the first (``CLS``) token, L2
normalized unless ``normalize`` is false. ``--override-pooler-config '{"pooling_type":
"MEAN", "normalize": false}'`` changes them (upstream V0's flag).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from vllm.pooling.st_config import sentence_transformers_pooler

logger = logging.getLogger(__name__)

POOLING_TYPES = ("LAST", "MEAN", "CLS")
TASKS = ("auto", "generate", "embed")
RUNNERS = ("auto", "generate", "pooling")
# Upstream's --convert: "embed" serves a generative checkpoint as an embedding model;
# "classify" and "reward" (its other conversions) are not served.
CONVERTS = ("auto", "none", "embed")


@dataclass
class PoolerConfig:
    """The pooler of an embedding engine.

    Args:
        pooling_type: ``LAST``, ``MEAN`` or ``CLS`` (see the module doc).
        normalize: L2-normalize each vector (default True).

    Raises:
        ValueError: an unknown pooling type.
    """

    pooling_type: str = "LAST"
    normalize: bool = True

    def __post_init__(self) -> None:
        self.pooling_type = str(self.pooling_type).upper()
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type={self.pooling_type!r} is not supported; use one of "
                f"{list(POOLING_TYPES)}."
            )
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}.")

    @property
    def needs_whole_prompt(self) -> bool:
        """MEAN and CLS read hidden states of every (or the first) prompt token, so no
        token may come from the prefix cache or an earlier chunk."""
        return self.pooling_type != "LAST"


def resolve_pooler(
    task: str,
    runner: str,
    overrides: dict | None,
    headless: bool = False,
    convert: str = "auto",
    model: str | None = None,
) -> PoolerConfig | None:
    """The PoolerConfig the flags ask for, None for a generative engine. A ``headless``
    checkpoint (a decoder stack without an LM head, ``LlamaModel`` ...) is an embedding
    model under ``auto``, as upstream resolves it.

    An embedding engine's pooler starts from the defaults (``LAST``, normalized), then what
    ``model``'s Sentence Transformers files declare (vllm/pooling/st_config.py), then the
    ``overrides``, each key replacing the one before, as upstream layers them.

    ``task="embedding"``, upstream's older name, is taken as ``embed`` with a warning.
    ``convert`` is upstream's ``--convert``: ``embed`` asks for embeddings as
    ``task="embed"`` does; ``auto`` and ``none`` leave the choice to task and runner.

    Raises:
        ValueError: an unknown task, runner or convert (pooling tasks other than embed:
            classify, score, reward are not served), a generate task or runner with the
            pooling runner, ``convert="embed"`` or a headless checkpoint, override keys
            other than ``pooling_type`` / ``normalize``, or Sentence Transformers files
            that cannot be read or declare a pooling not implemented here.
    """
    if task == "embedding":
        logger.warning("task='embedding' is upstream's old name of task='embed'; using embed.")
        task = "embed"
    for name, value, allowed in (
        ("task", task, TASKS), ("runner", runner, RUNNERS), ("convert", convert, CONVERTS)
    ):  # fmt: skip
        if value not in allowed:
            raise ValueError(
                f"{name}={value!r} is not supported; use one of {list(allowed)} (embedding "
                "is the only pooling task served; classification, scoring and reward "
                "models are not)."
            )
    embed = task == "embed" or runner == "pooling" or convert == "embed"
    if embed and (task == "generate" or runner == "generate"):
        raise ValueError(
            f"task={task!r}, runner={runner!r} and convert={convert!r} contradict each other."
        )
    if headless:
        if "generate" in (task, runner):
            raise ValueError(
                "the checkpoint is a decoder stack without an LM head (its architecture "
                "ends in Model): it serves embeddings only (task='embed'), not generation."
            )
        embed = True
    if not embed:
        if overrides:
            raise ValueError("override_pooler_config needs task='embed' (--task embed).")
        return None
    overrides = dict(overrides or {})
    unknown = set(overrides) - {"pooling_type", "normalize"}
    if unknown:
        raise ValueError(
            f"override_pooler_config has unknown keys {sorted(unknown)}; supported: "
            "pooling_type, normalize."
        )
    declared = None
    if model is not None and os.path.isdir(model):
        declared = sentence_transformers_pooler(model, type_given="pooling_type" in overrides)
    declared = {k: v for k, v in (declared or {}).items() if v is not None}
    return PoolerConfig(**{**declared, **overrides})
