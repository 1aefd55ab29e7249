"""The tool-call parser interface and the registry that picks a parser by name.

A parser turns a model's finished text into OpenAI tool calls for tool_choice "auto"
(``vllm serve --enable-auto-tool-choice --tool-call-parser NAME``). It does not parse
incrementally: while a reply streams, it only says how much of the text so far is surely
content (:meth:`ToolParser.content_prefix`); that much streams as content, and the rest
is held and parsed when the choice finishes, its calls sent whole in one delta.

The server parses through :meth:`ToolParser.extract_for`, which also gets the request's
``tools``; a parser whose format reads the tools' schemas (glm45: which arguments are
strings) overrides it, the others implement only ``extract(text)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm.entrypoints.openai.protocol import (
    ChatCompletionToolsParam,
    FunctionCall,
    ToolCall,
    random_id,
)
from vllm.utils.text_utils import partial_marker_len

_PARSERS: dict[str, type[ToolParser]] = {}

# What decoding a reply's JSON may raise: ValueError for malformed text, RecursionError
# for nesting deeper than the interpreter's limit (a model looping on "[" or "{"). Either
# leaves the reply as content.
JSON_ERRORS = (ValueError, RecursionError)


@dataclass
class ExtractedToolCalls:
    """What a parser found in a finished text.

    Attributes:
        calls: the tool calls, in order; empty: none, and ``content`` is the whole text.
        content: the text outside the calls; None when there is none but whitespace.
    """

    calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None


class ToolParser:
    """Base of the tool-call parsers; subclasses register with :func:`register_tool_parser`."""

    name: ClassVar[str]
    # the format's markers are special tokens: replies are detokenized keeping them
    keeps_special_tokens: ClassVar[bool] = False

    def extract(self, text: str) -> ExtractedToolCalls:
        """The tool calls in ``text``, a finished reply. Text that holds no complete,
        well-formed call gives no calls and the whole text as content."""
        raise NotImplementedError

    def extract_for(
        self, text: str, tools: Sequence[ChatCompletionToolsParam] | None
    ) -> ExtractedToolCalls:
        """:meth:`extract` for a request whose ``tools`` field is ``tools`` (None: the
        request sent none): what the server calls, streamed or not. The default ignores
        the tools; a format whose text alone does not say a value's type overrides it."""
        return self.extract(text)

    def content_prefix(self, text: str) -> int:
        """How many leading characters of ``text`` (a reply so far) are content whatever
        follows; never fewer than for any prefix of ``text``."""
        raise NotImplementedError

    def call_id(self) -> str:
        """A fresh tool-call id in the form the model's chat template accepts back
        (``chatcmpl-tool-<32 hex digits>``, upstream's, unless the format needs another);
        also used for tool_choice "required" and named calls on a server with this parser."""
        return random_id("chatcmpl-tool")


def content_before(text: str, marker: str) -> int:
    """:meth:`ToolParser.content_prefix` of a format whose calls start at ``marker``: the
    text before the first ``marker`` (and before a tail that may begin one); nothing while
    that text is only whitespace (it may turn out to be no content)."""
    cut = text.find(marker)
    if cut == -1:
        cut = len(text) - partial_marker_len(text, marker)
    return cut if text[:cut].strip() else 0


def extract_blocks(
    text: str, start: str, end: str, parse: Callable[[str], ToolCall | None]
) -> ExtractedToolCalls:
    """The calls of a format whose calls are ``start`` BODY ``end`` blocks, each BODY one
    call (``parse(body)``, None when it does not parse): the text before the first block
    is content, text between or after the blocks is dropped. No block, an unclosed one or
    one that does not parse makes the whole text content (e.g. a reply cut by max_tokens).
    """
    if start not in text:
        return ExtractedToolCalls(content=text)
    calls, pos = [], 0
    while (at := text.find(start, pos)) != -1:
        stop = text.find(end, at)
        if stop == -1:
            return ExtractedToolCalls(content=text)
        call = parse(text[at + len(start) : stop])
        if call is None:
            return ExtractedToolCalls(content=text)
        calls.append(call)
        pos = stop + len(end)
    content = text[: text.find(start)]
    return ExtractedToolCalls(calls=calls, content=content if content.strip() else None)


def make_call(name: Any, arguments: Any) -> ToolCall | None:
    """A ToolCall of function ``name`` with ``arguments`` (an object) as JSON text; None
    when the name is not a string, the arguments not an object, or they hold a value JSON
    cannot write (a complex number, a set, a tuple key, ...) or strict JSON has no literal
    for (NaN, Infinity: ``allow_nan=False``)."""
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return ToolCall(function=FunctionCall(name=name, arguments=text))


# what every parser implements (the base class's versions only raise)
_REQUIRED_METHODS = ("extract", "content_prefix")


def register_tool_parser(name: str):
    """Class decorator: make the parser available as ``--tool-call-parser name``.

    Raises:
        TypeError: naming the parser: the class is not a :class:`ToolParser`, or it does not
            implement ``extract`` and ``content_prefix`` (so a ``--tool-parser-plugin`` file
            with such a class is a start-up error, not a failure of each request).
    """

    def register(cls: type[ToolParser]) -> type[ToolParser]:
        if not (isinstance(cls, type) and issubclass(cls, ToolParser)):
            raise TypeError(
                f"tool parser {name!r}: {cls!r} is not a subclass of "
                "vllm.entrypoints.openai.tool_parsers.ToolParser."
            )
        missing = [m for m in _REQUIRED_METHODS if getattr(cls, m) is getattr(ToolParser, m)]
        if missing:
            raise TypeError(
                f"tool parser {name!r} ({cls.__qualname__}) does not implement "
                f"{' and '.join(m + '(text)' for m in missing)}."
            )
        cls.name = name
        _PARSERS[name] = cls
        return cls

    return register


def tool_parser_names() -> list[str]:
    """The registered parser names, sorted."""
    return sorted(_PARSERS)


def get_tool_parser(name: str) -> ToolParser:
    """A parser instance by its registered name.

    Raises:
        ValueError: no parser has that name (the message lists the choices).
    """
    cls = _PARSERS.get(name)
    if cls is None:
        raise ValueError(
            f"--tool-call-parser {name!r} is not a known parser; choose one of "
            f"{', '.join(tool_parser_names())}."
        )
    return cls()
