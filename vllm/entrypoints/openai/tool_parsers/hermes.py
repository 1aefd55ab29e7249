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
        if START not in text:
            return ExtractedToolCalls(content=text)
        calls, pos = [], 0
        while (start := text.find(START, pos)) != -1:
            end = text.find(END, start)
            if end == -1:
                return ExtractedToolCalls(content=text)
            try:
                obj = json.loads(text[start + len(START) : end])
            except JSON_ERRORS:
                return ExtractedToolCalls(content=text)
            call = (
                make_call(obj.get("name"), obj.get("arguments")) if isinstance(obj, dict) else None
            )
            if call is None:
                return ExtractedToolCalls(content=text)
            calls.append(call)
            pos = end + len(END)
        content = text[: text.find(START)]
        return ExtractedToolCalls(calls=calls, content=content if content.strip() else None)

    def content_prefix(self, text: str) -> int:
        """Text before the first ``<tool_call>`` (see :func:`content_before`)."""
        return content_before(text, START)
