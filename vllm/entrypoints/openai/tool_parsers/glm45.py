"""The ``glm45`` tool-call format (GLM-4.5 / GLM-4.5-Air / GLM-4.6, ``Glm4MoeForCausalLM``,
with their own chat templates): each call is a block

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

with zero or more key / value pairs; the whitespace between the parts may vary (or be
missing). The template writes a string value as its bare text and any other value as
JSON, so the text alone does not say whether ``123`` was the number or the string: this
parser reads the request's tools (:meth:`ToolParser.extract_for`). A value whose
parameter the tool's schema types ``"string"`` (or a type list holding ``"string"``)
stays the text between the tags; any other value is decoded as JSON when it parses as
strict JSON (no NaN / Infinity) and kept as text otherwise, which is also what happens
to every value of a tool the request does not describe. Keys and values are stripped of
surrounding whitespace, as upstream's parser does. The text before the first
``<tool_call>`` is content; text between or after the blocks is dropped, as the hermes
parser does."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.openai.protocol import ChatCompletionToolsParam, ToolCall
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
KEY = "<arg_key>"
# one argument: a key (no tag inside it) and its value, each between its tags, with any
# whitespace before and between them; the value ends at its first closing tag
_PAIR = re.compile(r"\s*<arg_key>([^<]*)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@register_tool_parser("glm45")
class Glm45ToolParser(ToolParser):
    """Parses ``<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>``
    blocks. An unclosed block (a reply cut by max_tokens) or a malformed one (no name, a
    name with spaces or tags, a key without its value, other text among the arguments)
    makes the whole text content."""

    def extract(self, text: str) -> ExtractedToolCalls:
        """:meth:`extract_for` without a request's tools: every value that parses as JSON
        is decoded."""
        return self.extract_for(text, None)

    def extract_for(
        self, text: str, tools: Sequence[ChatCompletionToolsParam] | None
    ) -> ExtractedToolCalls:
        """See :meth:`ToolParser.extract_for`; ``tools`` types the values (module doc)."""
        schemas = _parameter_schemas(tools)
        return extract_blocks(text, START, END, lambda body: _call(body, schemas))

    def content_prefix(self, text: str) -> int:
        """Text before the first ``<tool_call>`` (see :func:`content_before`)."""
        return content_before(text, START)


def _parameter_schemas(tools: Sequence[ChatCompletionToolsParam] | None) -> dict[str, dict]:
    """Function name -> its parameters' ``properties`` (those that are objects)."""
    out: dict[str, dict] = {}
    for tool in tools or ():
        params = tool.function.parameters
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(props, dict):
            out.setdefault(tool.function.name, props)
    return out


def _call(body: str, schemas: dict[str, dict]) -> ToolCall | None:
    """The call in one block's ``body``; None when it is malformed."""
    cut = body.find(KEY)
    name = (body if cut == -1 else body[:cut]).strip()
    if not name or any(c.isspace() or c in "<>" for c in name):
        return None
    props = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    pos = len(body) if cut == -1 else cut
    while (m := _PAIR.match(body, pos)) is not None:
        key = m.group(1).strip()
        if not key:
            return None
        arguments[key] = _value(m.group(2).strip(), props.get(key))
        pos = m.end()
    if body[pos:].strip():  # a key without its value, text that is no argument
        return None
    return make_call(name, arguments)


def _value(raw: str, schema: Any) -> Any:
    """One argument's value: the text itself for a string parameter, else its JSON value
    when it has one JSON can write back (not NaN or an infinity), else the text."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return raw
    try:
        value = json.loads(raw)
        json.dumps(value, allow_nan=False)
    except JSON_ERRORS:
        return raw
    return value
