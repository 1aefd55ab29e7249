"""The ``llama3_json`` tool-call format (Llama 3.1 / 3.2 JSON tool calling): the whole
reply is a JSON object ``{"name": ..., "parameters": {...}}`` (``arguments`` is accepted
too), or several separated by ``;``."""

from __future__ import annotations

import json

from vllm.entrypoints.openai.tool_parsers.abstract import (
    JSON_ERRORS,
    ExtractedToolCalls,
    ToolParser,
    make_call,
    register_tool_parser,
)

_DECODER = json.JSONDecoder()


@register_tool_parser("llama3_json")
class Llama3JsonToolParser(ToolParser):
    """Parses a reply that starts with ``{`` as ``;``-separated call objects; anything
    else, or anything that does not parse completely, is content."""

    def extract(self, text: str) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract`."""
        calls, pos = [], 0
        while True:
            pos = _skip_space(text, pos)
            try:
                obj, pos = _DECODER.raw_decode(text, pos)
            except JSON_ERRORS:
                return ExtractedToolCalls(content=text)
            args = obj.get("parameters", obj.get("arguments")) if isinstance(obj, dict) else None
            call = make_call(obj.get("name"), args) if isinstance(obj, dict) else None
            if call is None:
                return ExtractedToolCalls(content=text)
            calls.append(call)
            pos = _skip_space(text, pos)
            if pos == len(text):
                return ExtractedToolCalls(calls=calls, content=None)
            if text[pos] != ";":
                return ExtractedToolCalls(content=text)
            pos += 1

    def content_prefix(self, text: str) -> int:
        """All of it once its first non-space character is not ``{``; else nothing."""
        head = text.lstrip()
        return len(text) if head and not head.startswith("{") else 0


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
