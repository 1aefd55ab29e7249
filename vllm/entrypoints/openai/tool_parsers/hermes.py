"""The ``hermes`` tool-call format (Hermes 2 Pro, Qwen2.5 and others): each call is a JSON
object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``;
the text before the first block is content, and text between or after the blocks is
dropped, as upstream's parser does (streamed or not)."""

from __future__ import annotations

import json

from vllm.entrypoints.openai.tool_parsers.abstract import (
    JSON_ERRORS,
    ExtractedToolCalls,
    ToolParser,
    content_before,
    extract_blocks,
    make_call,
    register_tool_parser,
)

START, END = "<tool_call>", "</tool_call>"


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """Parses ``<tool_call>{...}</tool_call>`` blocks. An unclosed block or one whose body
    is not such an object makes the whole text content (e.g. a reply cut by max_tokens)."""

    def extract(self, text: str) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract`."""
        return extract_blocks(text, START, END, _call)

    def content_prefix(self, text: str) -> int:
        """Text before the first ``<tool_call>`` (see :func:`content_before`)."""
        return content_before(text, START)


def _call(body: str):
    """``{"name": ..., "arguments": {...}}`` -> a call; None when it is not such an object."""
    try:
        obj = json.loads(body)
    except JSON_ERRORS:
        return None
    return make_call(obj.get("name"), obj.get("arguments")) if isinstance(obj, dict) else None
