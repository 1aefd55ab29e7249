"""The ``pythonic`` tool-call format (Llama 3.2 and Llama 4 with their pythonic chat
templates, and others): the whole reply is a Python list of calls with keyword
arguments, ``[get_weather(city="Paris", days=3), get_time()]``; argument values are
Python literals (strings, numbers, True / False / None, lists, dicts)."""

from __future__ import annotations

import ast

from vllm.entrypoints.openai.tool_parsers.abstract import (
    ExtractedToolCalls,
    ToolParser,
    make_call,
    register_tool_parser,
)


@register_tool_parser("pythonic")
class PythonicToolParser(ToolParser):
    """Parses a reply that starts with ``[`` as a list of calls; anything else, or a list
    that does not parse completely (cut by max_tokens, positional arguments, non-literal
    values, values JSON cannot hold such as ``2j`` or ``{1, 2}``), is content."""

    def extract(self, text: str) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract`."""
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            # not Python, or nested past the parser's limits ("-" or "[" repeated)
            return ExtractedToolCalls(content=text)
        if not isinstance(tree, ast.List) or not tree.elts:
            return ExtractedToolCalls(content=text)
        calls = [_call(node) for node in tree.elts]
        if any(c is None for c in calls):
            return ExtractedToolCalls(content=text)
        return ExtractedToolCalls(calls=calls, content=None)

    def content_prefix(self, text: str) -> int:
        """All of it once its first non-space character is not ``[``; else nothing."""
        head = text.lstrip()
        return len(text) if head and not head.startswith("[") else 0


def _call(node: ast.expr):
    """``name(key=literal, ...)`` -> a call; None when ``node`` is not such a call or its
    arguments cannot be written as a JSON object."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None  # not a literal, or one Python cannot build (a set holding a list)
    if None in arguments:  # a **kwargs expansion
        return None
    return make_call(node.func.id, arguments)
