"""SSE chunks of a streamed response built from a template: one pydantic dump per stream.

A streamed completion sends one chunk per token, and nearly every chunk differs from the
previous one only in its text: building and dumping the pydantic response for each one
costs about as much as the rest of the per-token work on the server's event loop. A
:class:`TextChunkTemplate` dumps the response once with a marker in place of the text,
splits the JSON around the marker, and then formats each chunk as prefix + the text as a
JSON string + suffix. ``json.dumps(..., ensure_ascii=False)`` escapes what pydantic's
serializer escapes (quotes, backslashes and control characters; other characters are
written as they are), so a chunk is byte-for-byte the pydantic dump of the same response
(tests/entrypoints/test_sse_template.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel

_MARKER = "__vllm_sse_text_marker__"


class TextChunkTemplate:
    """The SSE line of ``response`` with its text field open.

    Args:
        response: a response whose text field (e.g. a completion choice's ``text`` or a
            chat delta's ``content``) holds :data:`TextChunkTemplate.MARKER`.
    Raises:
        ValueError: the marker does not occur exactly once in the response's JSON.
    """

    MARKER = _MARKER

    def __init__(self, response: BaseModel):
        dumped = response.model_dump_json()
        quoted = json.dumps(_MARKER)
        if dumped.count(quoted) != 1:
            raise ValueError(
                f"the template response must hold the marker {_MARKER!r} exactly once in one "
                f"string field; its JSON has it {dumped.count(quoted)} times"
            )
        head, tail = dumped.split(quoted)
        self._head = "data: " + head
        self._tail = tail + "\n\n"

    def format(self, text: str) -> str:
        """The SSE line ``data: <json>\\n\\n`` of the response with ``text`` in the field."""
        return self._head + json.dumps(text, ensure_ascii=False) + self._tail


class TextChunks:
    """The plain text chunks of one streamed response, a :class:`TextChunkTemplate` per
    choice, each made on its choice's first chunk.

    Args:
        make: (choice index, text) -> the response of a chunk holding only that text.
    """

    def __init__(self, make: Callable[[int, str], BaseModel]):
        self._make = make
        self._templates: dict[int, TextChunkTemplate] = {}

    def format(self, index: int, text: str) -> str:
        """The SSE line of choice ``index`` carrying ``text``."""
        template = self._templates.get(index)
        if template is None:
            template = TextChunkTemplate(self._make(index, TextChunkTemplate.MARKER))
            self._templates[index] = template
        return template.format(text)
