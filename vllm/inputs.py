"""Prompt types of the offline API and the engine (upstream vLLM's ``vllm.inputs`` names).

A prompt is one of:

- a string: the text, tokenized by the engine's tokenizer;
- :class:`TextPrompt`: ``{"prompt": text}``;
- :class:`TokensPrompt`: ``{"prompt_token_ids": [...]}``, optionally with the ``prompt``
  text they came from (then not tokenized again; the text is reported in outputs);
- a list of token ids.

``LLMEngine.process_prompt`` validates them (empty prompts and ids outside the
vocabulary are refused with a ValueError).
"""

from __future__ import annotations

from typing import Any, Required, TypedDict


class TextPrompt(TypedDict, total=False):
    """A text prompt: ``prompt`` is tokenized by the engine (special tokens added as the
    tokenizer does by default)."""

    prompt: Required[str]


class TokensPrompt(TypedDict, total=False):
    """A prompt given as token ids (each in ``[0, vocab_size)``); ``prompt`` is the
    optional text they encode, reported back in the output."""

    prompt_token_ids: Required[list[int]]
    prompt: str


PromptType = str | TextPrompt | TokensPrompt | dict[str, Any] | list[int]


def prompt_list(prompts: PromptType | list[PromptType]) -> list[PromptType]:
    """One prompt (text, a prompt dict, or a list of token ids) as a list of one; a sequence
    of prompts as a list. A list whose first item is an int is one prompt of token ids."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if prompts and isinstance(prompts, list) and isinstance(prompts[0], int):
        return [prompts]
    return list(prompts)
