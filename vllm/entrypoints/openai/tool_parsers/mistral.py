"""The ``mistral`` tool-call format (Mistral 7B v0.3, Mistral Small / Nemo and later): the
``[TOOL_CALLS]`` control token, then either a JSON array of ``{"name", "arguments"}``
objects (older tokenizers) or one or more ``NAME[ARGS]{...}`` / ``NAME{...}`` calls, each
after its own ``[TOOL_CALLS]`` (newer ones); text before the first ``[TOOL_CALLS]`` is
content. ``[TOOL_CALLS]`` is a special token, so this parser asks for replies detokenized
with special tokens kept (:attr:`ToolParser.keeps_special_tokens`). Call ids are 9
letters and digits, the only form Mistral's chat templates and mistral-common accept when
the calls come back in the conversation."""

from __future__ import annotations

import json
import secrets
import string

from vllm.entrypoints.openai.tool_parsers.abstract import (
    JSON_ERRORS,
    ExtractedToolCalls,
    ToolParser,
    content_before,
    make_call,
    register_tool_parser,
)

TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"
_DECODER = json.JSONDecoder()
_ID_CHARS = string.ascii_letters + string.digits
ID_LENGTH = 9


def mistral_call_id() -> str:
    """A fresh call id in Mistral's form: 9 random ASCII letters and digits."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(ID_LENGTH))


@register_tool_parser("mistral")
class MistralToolParser(ToolParser):
    """Parses what follows the first ``[TOOL_CALLS]``; a body that does not parse
    completely (e.g. cut by max_tokens) makes the whole text content."""

    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract`."""
        start = text.find(TAG)
        if start == -1:
            return ExtractedToolCalls(content=text)
        calls = _array_calls(text[start + len(TAG) :])
        if calls is None:
            calls = [_named_call(body) for body in text[start:].split(TAG)[1:]]
        if not calls or any(c is None for c in calls):
            return ExtractedToolCalls(content=text)
        calls = [c.model_copy(update={"id": self.call_id()}) for c in calls]
        content = text[:start]
        return ExtractedToolCalls(calls=calls, content=content if content.strip() else None)

    def content_prefix(self, text: str) -> int:
        """Text before the first ``[TOOL_CALLS]`` (see :func:`content_before`)."""
        return content_before(text, TAG)

    def call_id(self) -> str:
        """Mistral's form (:func:`mistral_call_id`)."""
        return mistral_call_id()


def _array_calls(body: str) -> list | None:
    """``[{"name", "arguments"}, ...]`` -> calls; None when ``body`` is not such an array."""
    try:
        obj, end = _DECODER.raw_decode(body.lstrip())
    except JSON_ERRORS:
        return None
    if not isinstance(obj, list) or body.lstrip()[end:].strip():
        return None
    return [make_call(o.get("name"), o.get("arguments")) if isinstance(o, dict) else None
            for o in obj]  # fmt: skip


def _named_call(body: str):
    """``NAME[ARGS]{...}`` or ``NAME{...}`` -> a call; None when it does not parse."""
    name, sep, args = body.partition(ARGS)
    if not sep:
        brace = body.find("{")
        if brace <= 0:
            return None
        name, args = body[:brace], body[brace:]
    try:
        arguments = json.loads(args)
    except JSON_ERRORS:
        return None
    return make_call(name.strip(), arguments)
