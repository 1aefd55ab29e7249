"""The DeepSeek tool-call formats, whose markers are special tokens of DeepSeek's
tokenizer written with full-width bars (U+FF5C) and U+2581 in place of spaces:

- ``deepseek_v3`` (DeepSeek-V3, V3-0324 and R1-0528 with their chat templates):
  ``<｜tool▁calls▁begin｜>``, then one or more
  ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``, a newline, the arguments object in a
  Markdown code fence (three backticks and ``json``, its own lines), and
  ``<｜tool▁call▁end｜>``; then ``<｜tool▁calls▁end｜>``.
- ``deepseek_v31`` (DeepSeek-V3.1 and V3.1-Terminus): the same frame, each call
  ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>`` (no type, no fence).

The text before ``<｜tool▁calls▁begin｜>`` is content; text after ``<｜tool▁calls▁end｜>``
is dropped, as upstream's parsers do. Whitespace between the markers is allowed. Both
parsers ask for replies detokenized with special tokens kept
(:attr:`ToolParser.keeps_special_tokens`); call ids are upstream's default form (the
templates do not write them back)."""

from __future__ import annotations

import json
import re

from vllm.entrypoints.openai.protocol import ToolCall
from vllm.entrypoints.openai.tool_parsers.abstract import (
    JSON_ERRORS,
    ExtractedToolCalls,
    ToolParser,
    content_before,
    make_call,
    register_tool_parser,
)


def _marker(*words: str) -> str:
    """A DeepSeek special token: ``<｜`` + words joined by U+2581 + ``｜>``."""
    return "<\uff5c" + "\u2581".join(words) + "\uff5c>"


CALLS_BEGIN = _marker("tool", "calls", "begin")
CALLS_END = _marker("tool", "calls", "end")
CALL_BEGIN = _marker("tool", "call", "begin")
CALL_END = _marker("tool", "call", "end")
SEP = _marker("tool", "sep")

_SPACE = re.compile(r"\s*")
_NAME = r"\s*([^\s<>`]+)\s*"  # a function name: no space, no marker or fence inside it
# deepseek_v3's call: type, separator, name, then the arguments in a ```json fence
_V3_CALL = re.compile(
    r"\s*function\s*" + re.escape(SEP) + _NAME + r"```json\s*(.*?)\s*```\s*", re.DOTALL
)
# deepseek_v31's call: name, separator, the arguments object
_V31_CALL = re.compile(_NAME + re.escape(SEP) + r"(.*)", re.DOTALL)


class _DeepSeekToolParser(ToolParser):
    """The frame both formats share; subclasses parse one call's body (:meth:`_call`).
    An unclosed frame or call (a reply cut by max_tokens), a frame with no calls or with
    other text among them, or a call that does not parse (arguments that are not a JSON
    object) makes the whole text content."""

    keeps_special_tokens = True
    _pattern: re.Pattern[str]

    def extract(self, text: str) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract`."""
        start = text.find(CALLS_BEGIN)
        if start == -1:
            return ExtractedToolCalls(content=text)
        end = text.find(CALLS_END, start)
        if end == -1:
            return ExtractedToolCalls(content=text)
        body, calls = text[start + len(CALLS_BEGIN) : end], []
        pos = _SPACE.match(body).end()
        while pos < len(body):
            stop = body.find(CALL_END, pos)
            if not body.startswith(CALL_BEGIN, pos) or stop == -1:
                return ExtractedToolCalls(content=text)
            call = self._call(body[pos + len(CALL_BEGIN) : stop])
            if call is None:
                return ExtractedToolCalls(content=text)
            calls.append(call)
            pos = _SPACE.match(body, stop + len(CALL_END)).end()
        if not calls:
            return ExtractedToolCalls(content=text)
        content = text[:start]
        return ExtractedToolCalls(calls=calls, content=content if content.strip() else None)

    def content_prefix(self, text: str) -> int:
        """Text before the first ``<｜tool▁calls▁begin｜>`` (see :func:`content_before`)."""
        return content_before(text, CALLS_BEGIN)

    def _call(self, body: str) -> ToolCall | None:
        """The call between one call's begin and end markers; None when it does not
        parse."""
        m = self._pattern.fullmatch(body)
        if m is None:
            return None
        try:
            arguments = json.loads(m.group(2))
        except JSON_ERRORS:
            return None
        return make_call(m.group(1), arguments)


@register_tool_parser("deepseek_v3")
class DeepSeekV3ToolParser(_DeepSeekToolParser):
    """Calls of the form ``function<｜tool▁sep｜>NAME`` then the arguments object in a
    json code fence; another type than ``function``, or no fence, is malformed."""

    _pattern = _V3_CALL


@register_tool_parser("deepseek_v31")
class DeepSeekV31ToolParser(_DeepSeekToolParser):
    """Calls of the form ``NAME<｜tool▁sep｜>{...}``."""

    _pattern = _V31_CALL
