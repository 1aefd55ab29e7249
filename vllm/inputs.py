"""Prompt types of the offline API and the engine (upstream vLLM's ``vllm.inputs`` names).

A prompt is one of:

- a string: the text, tokenized by the engine's tokenizer;
- :class:`TextPrompt`: ``{"prompt": text}``;
- :class:`TokensPrompt`: ``{"prompt_token_ids": [...]}``, optionally with the ``prompt``
  text they came from (then not tokenized again; the text is reported in outputs);
- a list of token ids.

A prompt dict may carry ``cache_salt`` (upstream's field): a non-empty string mixed into
the prefix-cache hash of every block of the request, so its cached blocks are shared only
with requests of the same salt (one tenant's prompts cannot be probed by another's
cache hits).

``LLMEngine.process_prompt`` validates them (empty prompts, ids outside the vocabulary
and a salt that is not a non-empty string are refused with a ValueError).
"""

from __future__ import annotations

import numbers
from typing import Any, Required, TypedDict


class TextPrompt(TypedDict, total=False):
    """A text prompt: ``prompt`` is tokenized by the engine (special tokens added as the
    tokenizer does by default)."""

    prompt: Required[str]
    cache_salt: str


class TokensPrompt(TypedDict, total=False):
    """A prompt given as token ids (each in ``[0, vocab_size)``); ``prompt`` is the
    optional text they encode, reported back in the output."""

    prompt_token_ids: Required[list[int]]
    prompt: str
    cache_salt: str


PromptType = str | TextPrompt | TokensPrompt | dict[str, Any] | list[int]


def prompt_list(prompts: PromptType | list[PromptType]) -> list[PromptType]:
    """One prompt (text, a prompt dict, or a list of token ids) as a list of one; a sequence
    of prompts as a list. A list whose first item is an int is one prompt of token ids.

    Raises:
        ValueError: ``prompts`` is none of these (a number, say).
    """
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(
            "prompts must be a string, a prompt dict, a list of token ids or a list of "
            f"prompts, got {type(prompts).__name__}."
        )
    if prompts and isinstance(prompts, list) and isinstance(prompts[0], numbers.Integral):
        return [prompts]
    return list(prompts)


def prompt_cache_salt(prompt: PromptType) -> str | None:
    """The prompt's ``cache_salt`` (None when it has none; only prompt dicts carry one).

    Raises:
        ValueError: the salt is not a non-empty string.
    """
    if not isinstance(prompt, dict) or prompt.get("cache_salt") is None:
        return None
    salt = prompt["cache_salt"]
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}.")
    return salt
