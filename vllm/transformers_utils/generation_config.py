"""A model's ``generation_config.json``: extra end-of-sequence ids and sampling defaults.

Hugging Face checkpoints ship their recommended decoding settings in
``generation_config.json``. Two parts of it matter when serving:

- ``eos_token_id`` may list several ids (Llama-3.1: ``<|end_of_text|>``, ``<|eom_id|>``,
  ``<|eot_id|>``; Qwen2.5: ``<|im_end|>``, ``<|endoftext|>``) where the tokenizer names
  only one. Upstream vLLM stops a sequence on every one of them (the ones besides the
  tokenizer's own become stop token ids of each request, unless ``ignore_eos``).
- ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and
  ``max_new_tokens`` (as ``max_tokens``), where the file sets them, are the defaults of
  requests that leave those fields out (upstream's ``--generation-config auto``, its
  default; ``vllm`` ignores the file).

``--override-generation-config '{"temperature": 0.5}'`` replaces or adds those fields (by
their generation-config names), with or without a file, as upstream.

``--generation-config`` takes ``auto`` (the model directory's file, when there is one; a
GGUF file has none), ``vllm`` (none) or a directory holding a ``generation_config.json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# generation_config.json field -> SamplingParams field, the ones upstream takes as defaults
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
FILE_NAME = "generation_config.json"


@dataclass
class GenerationDefaults:
    """What a model's generation config changes in this engine.

    Attributes:
        eos_token_ids: every end-of-sequence id the file lists (may be empty).
        sampling: SamplingParams field -> default, only for the fields the file sets to a
            value other than transformers' own default (``GenerationConfig.to_diff_dict``).
        source: the directory the file was read from, or None when none was read.
        overridden: the ``sampling`` fields set by ``--override-generation-config``.
    """

    eos_token_ids: list[int] = field(default_factory=list)
    sampling: dict[str, float | int] = field(default_factory=dict)
    source: str | None = None
    overridden: list[str] = field(default_factory=list)

    def describe_source(self) -> str:
        """Where ``sampling`` came from, for the start-up log."""
        parts = [os.path.join(self.source, FILE_NAME)] if self.source else []
        if self.overridden:
            parts.append(f"--override-generation-config ({', '.join(self.overridden)})")
        return " and ".join(parts) or "nowhere"


def resolve_source(model: str, generation_config: str) -> str | None:
    """The directory to read ``generation_config.json`` from, or None for none.

    Args:
        model: the model path (a Hugging Face directory or a .gguf file).
        generation_config: ``auto``, ``vllm`` or a directory.

    Raises:
        ValueError: a directory that does not exist or holds no generation_config.json.
    """
    if generation_config == "vllm":
        return None
    if generation_config == "auto":
        found = os.path.isdir(model) and os.path.isfile(os.path.join(model, FILE_NAME))
        return model if found else None
    if not os.path.isfile(os.path.join(generation_config, FILE_NAME)):
        raise ValueError(
            f"generation_config={generation_config!r} must be 'auto', 'vllm' or a directory "
            f"holding {FILE_NAME}."
        )
    return generation_config


def check_overrides(overrides: dict | None) -> dict[str, float | int]:
    """Check ``--override-generation-config``.

    Returns:
        the overrides under their SamplingParams names (``max_new_tokens`` ->
        ``max_tokens``), None values left out.
    Raises:
        ValueError: a key that is not one of the generation-config sampling fields (the
            message lists them), or a value SamplingParams refuses (checked here, at
            start-up, rather than in every request that leaves the field out).
    """
    unknown = sorted(set(overrides or ()) - set(_SAMPLING_FIELDS))
    if unknown:
        raise ValueError(
            f"override_generation_config has unknown field(s) {unknown}; the fields are "
            f"{list(_SAMPLING_FIELDS)} (generation_config.json names: max_new_tokens, not "
            "max_tokens)."
        )
    fields = {_SAMPLING_FIELDS[k]: v for k, v in (overrides or {}).items() if v is not None}
    if fields:
        from vllm.sampling_params import SamplingParams

        try:
            SamplingParams(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"override_generation_config: {e}") from None
    return fields


def load_generation_defaults(
    model: str, generation_config: str, overrides: dict | None = None
) -> GenerationDefaults:
    """Read the generation config :func:`resolve_source` picks (see the module docstring),
    then apply ``overrides`` (generation-config field -> value).

    Raises:
        ValueError: a bad ``generation_config`` directory, a file transformers cannot
            parse (the message names the file), or an unknown override field.
    """
    extra = check_overrides(overrides)
    source = resolve_source(model, generation_config)
    if source is None:
        return GenerationDefaults(sampling=extra, overridden=sorted(extra))
    from transformers import GenerationConfig

    try:
        diff = GenerationConfig.from_pretrained(source).to_diff_dict()
    except (OSError, ValueError) as e:
        raise ValueError(f"could not read {os.path.join(source, FILE_NAME)}: {e}") from e
    eos = diff.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else [int(t) for t in eos or ()]
    sampling = {
        ours: diff[theirs]
        for theirs, ours in _SAMPLING_FIELDS.items()
        if diff.get(theirs) is not None
    }
    return GenerationDefaults(
        eos_token_ids=eos_ids,
        sampling={**sampling, **extra},
        source=source,
        overridden=sorted(extra),
    )
