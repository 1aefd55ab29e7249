"""Chat templates: ``--chat-template`` (a file or an inline Jinja string, whose backslash
escapes such as ``\\n`` are read as Python reads them, as upstream), the messages a
template sees, and rendering a conversation to the prompt text the model sees.

Messages reach the template as OpenAI sends them, text only: ``role``, ``content``, and
where given ``name``, an assistant's ``tool_calls`` (each call's ``function.arguments``
decoded from its JSON text to an object, the form tool-use templates iterate over; empty
text is ``{}``, as upstream) and a tool message's ``tool_call_id``. The request's
``tools``, ``documents`` and ``chat_template_kwargs`` are template variables as well.

``content`` takes one of two forms (``--chat-template-content-format``, upstream's flag):

- ``string``: one string; a list of text parts becomes their texts joined by newlines.
- ``openai``: a list of parts ``[{"type": "text", "text": ...}]``, one per part sent (a
  string content is one part; no content is an empty list), for templates that loop over
  the parts.
- ``auto`` (the default) picks per template, as upstream: ``openai`` when the template
  loops over a message's content (``{% for part in message['content'] %}``, also through
  a ``{% set %}`` alias of the messages, a message or its content), else ``string``.
  Templates that only read ``messages[0]['content'][0]['text']`` in an ``is string``
  branch (Llama 3.1's) render a string content elsewhere, so they get ``string``.
"""

from __future__ import annotations

import codecs
import functools
import json
import logging
import os
import re
from typing import Any

logger = logging.getLogger(__name__)

CONTENT_FORMATS = ("auto", "string", "openai")

# A value containing any of these is Jinja, not a path.
_JINJA_MARKS = ("{{", "{%", "{#", "\n")

# The backslash escapes of Python string literals (\n, \t, \\, \u00e9, \x41, \101, ...).
_ESCAPE = re.compile(
    r"""\\(?:[\\'"abfnrtv]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3})"""
)


def load_chat_template(value: str | None) -> str | None:
    """The template text for ``--chat-template``: the contents of the file ``value`` names,
    or ``value`` itself when it is inline Jinja; None stays None (the tokenizer's own).

    Raises:
        ValueError: ``value`` is neither an existing file nor Jinja (a mistyped path), the
            file cannot be read, or the template is not valid Jinja (so the server fails at
            start-up, not on every chat request).
    """
    if value is None:
        return None
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as e:
            raise ValueError(f"--chat-template file {value!r} could not be read: {e}.") from e
        _check_template_syntax(text, f"file {value!r}")
        return text
    if any(mark in value for mark in _JINJA_MARKS):
        value = _unescape(value)
        _check_template_syntax(value, "(inline)")
        return value
    raise ValueError(
        f"--chat-template {value!r} is neither an existing file nor a Jinja template "
        "(inline templates contain '{{' or '{%')."
    )


def _unescape(value: str) -> str:
    """An inline template with its backslash escapes decoded, as upstream decodes one
    (``codecs.decode(value, "unicode_escape")``): a template typed on a command line or in
    a unit file writes a newline as ``\\n``. Characters other than escapes are kept as
    they are (unicode_escape alone would read non-ASCII text as Latin-1), and so is a
    backslash that starts no escape."""

    def decode(match: re.Match) -> str:
        try:
            return codecs.decode(match.group(0), "unicode_escape")
        except UnicodeDecodeError:  # \N{...} naming no character
            return match.group(0)

    return _ESCAPE.sub(decode, value)


def _check_template_syntax(template: str, shown: str) -> None:
    """Compile ``template`` in transformers' chat-template environment (the one that
    renders it, with its extra tags); raises ValueError naming ``--chat-template``
    ``shown``, Jinja's message and the line on a syntax error."""
    import jinja2

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers layout: rendering reports any error
        return
    try:
        _compile_jinja_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(
            f"--chat-template {shown} is not a valid Jinja template: {e.message} (line {e.lineno})."
        ) from None


def has_chat_template(tokenizer, template: str | None) -> bool:
    """Whether a chat can be rendered: an explicit ``template`` or the tokenizer's own."""
    return bool(template) or bool(getattr(tokenizer, "chat_template", None))


# Arguments of ``apply_chat_template`` that chat_template_kwargs may not replace.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
    }
)


class ChatInputError(ValueError):
    """A message or chat option that cannot be rendered; ``param`` is the request field
    (``messages.1.tool_calls.0.function.arguments``)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _content_texts(content: Any, i: int) -> list[str]:
    """A message's text parts: none for no content, one for a string, the parts' texts for
    a list; a content part other than text is refused (this engine is text-only), never
    silently dropped."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type", "text")
        if kind != "text":
            raise ChatInputError(
                f"messages[{i}].content[{j}] has type {kind!r}: this model takes text only "
                "(content parts of type 'text').",
                f"messages.{i}.content.{j}.type",
            )
        texts.append(str(part.get("text", "")))
    return texts


def _content(content: Any, i: int, content_format: str) -> str | list[dict]:
    """A message's content in ``content_format``: ``string`` joins the text parts with
    "\\n" (upstream vLLM's rendering, so ``[{"type": "text", "text": "a"}, {"type":
    "text", "text": "b"}]`` is ``"a\\nb"``), ``openai`` lists them as text parts."""
    texts = _content_texts(content, i)
    if content_format == "openai":
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def message_text(message: dict) -> str:
    """The text of a message from :func:`template_messages`, whichever content form it
    has (the parts' texts joined by "\\n", as the ``string`` form)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def _tool_call(call: dict, i: int, j: int) -> dict:
    """Message ``i``'s tool call ``j`` with its ``function.arguments`` decoded to an object;
    empty (or blank) arguments text is ``{}``, as clients replay calls without arguments.

    Raises:
        ChatInputError: arguments text that is not JSON.
    """
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str) and not args.strip():
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError as e:
            raise ChatInputError(
                f"messages[{i}].tool_calls[{j}].function.arguments is not JSON ({e}): "
                f"{args[:80]!r}.",
                f"messages.{i}.tool_calls.{j}.function.arguments",
            ) from None
    return {**call, "function": fn}


def template_messages(messages: list[dict], content_format: str = "string") -> list[dict]:
    """The messages a chat template sees (see the module docstring).

    Args:
        messages: OpenAI chat messages as dicts (``role``, ``content`` as a string or a
            list of text parts, optional ``name``, ``tool_calls``, ``tool_call_id``).
        content_format: ``string`` or ``openai`` (see :func:`resolve_content_format`).
    Raises:
        ChatInputError: a content part that is not text, or tool-call arguments that are
            not JSON.
    """
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m["role"], "content": _content(m.get("content"), i, content_format)}
        if m.get("name") is not None:
            msg["name"] = m["name"]
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = [_tool_call(c, i, j) for j, c in enumerate(m["tool_calls"])]
        if m.get("tool_call_id") is not None:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def check_chat_options(
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: dict | None,
) -> None:
    """Refuse options that contradict each other or replace a named argument.

    Raises:
        ChatInputError: continue_final_message with add_generation_prompt, or a reserved
            key in chat_template_kwargs.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatInputError(
            "continue_final_message=true continues the last message, so it needs "
            "add_generation_prompt=false (got true).",
            "continue_final_message",
        )
    clash = reserved_keys(chat_template_kwargs)
    if clash:
        raise ChatInputError(
            f"chat_template_kwargs must not set {clash}: they are arguments of their own "
            "(send them as request fields).",
            "chat_template_kwargs",
        )


def reserved_keys(template_kwargs: dict | None) -> list[str]:
    """The keys of ``template_kwargs`` in :data:`RESERVED_TEMPLATE_KWARGS`, sorted."""
    return sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs or {}))


def check_default_template_kwargs(defaults: object) -> dict:
    """``--default-chat-template-kwargs`` as the dict every chat request starts from
    (None: empty).

    Raises:
        ValueError: not a dict, or a key of :data:`RESERVED_TEMPLATE_KWARGS` (named).
    """
    defaults = {} if defaults is None else defaults
    if not isinstance(defaults, dict):
        raise ValueError(
            f"--default-chat-template-kwargs must be a JSON object, got {type(defaults).__name__}."
        )
    clash = reserved_keys(defaults)
    if clash:
        raise ValueError(
            f"--default-chat-template-kwargs must not set {clash}: they are arguments of their "
            "own, set per request."
        )
    return dict(defaults)


def render_chat(
    tokenizer,
    conversation: list[dict],
    template: str | None,
    add_generation_prompt: bool,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
    content_format_option: str = "auto",
    documents: list[dict] | None = None,
) -> str:
    """The prompt text of ``conversation`` (from :func:`template_messages`) under
    ``template`` (None: the tokenizer's own), with ``tools``, ``documents`` and
    ``chat_template_kwargs`` as template variables (a ``documents`` key of
    ``chat_template_kwargs`` wins over ``documents``, as upstream). With
    ``continue_final_message`` the text ends where the last message's content ends (no
    end-of-turn marker), so the model continues that message. Tokenize it with
    ``add_special_tokens=False``: the template writes the special tokens itself.

    Raises:
        ChatInputError: the template failed while ``content_format_option`` was set
            explicitly ("string" or "openai"): the likely cause is a template written for
            the other format (a Jinja ``TypeError`` joining a list to a string, say), so
            the message names ``chat_template_content_format`` and the value to try.
        Exception: the template's own error otherwise.
    """
    variables = {"documents": documents, **(chat_template_kwargs or {})}
    try:
        return tokenizer.apply_chat_template(
            conversation,
            tools=tools or None,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **variables,
        )
    except Exception as e:
        if content_format_option not in ("string", "openai"):
            raise
        other = "string" if content_format_option == "openai" else "openai"
        given = "a list of parts" if content_format_option == "openai" else "a string"
        raise ChatInputError(
            f"the chat template failed with chat_template_content_format="
            f"{content_format_option!r} (each message's content given as {given}): "
            f"{type(e).__name__}: {e}. The template may expect the other format: try "
            f"chat_template_content_format={other!r}, or 'auto' to detect it.",
            "chat_template_content_format",
        ) from e


def resolve_content_format(option: str, template: str | None, tokenizer=None) -> str:
    """``string`` or ``openai``: ``option`` itself, or for ``auto`` what
    :func:`detect_content_format` finds in ``template`` (None: the tokenizer's own; a
    tokenizer without a string template gets ``string``).

    Raises:
        ValueError: an ``option`` other than auto, string, openai.
    """
    if option not in CONTENT_FORMATS:
        raise ValueError(
            f"chat template content format {option!r} is not supported; use one of "
            f"{list(CONTENT_FORMATS)}."
        )
    if option != "auto":
        return option
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    return detect_content_format(template) if isinstance(template, str) else "string"


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> str:
    """``openai`` when ``template`` loops over a message's content, else ``string`` (also
    for a template Jinja cannot parse: rendering it reports the error). Logged once per
    template, as upstream logs its detection."""
    ast = _parse_template(template)
    found = "string" if ast is None else ("openai" if _loops_over_content(ast) else "string")
    logger.info(
        "Detected the chat template content format to be '%s'. You can set "
        "--chat-template-content-format to override this.", found,
    )  # fmt: skip
    return found


def _parse_template(template: str):
    """The Jinja AST of ``template`` in transformers' template environment (its extra
    tags parse too), else a plain environment's; None when neither parses it."""
    import jinja2
    import jinja2.ext

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template).environment.parse(template)
    except Exception:
        pass
    try:
        return jinja2.Environment(extensions=[jinja2.ext.loopcontrols]).parse(template)
    except Exception:
        return None


def _chain(node) -> tuple[str | None, list]:
    """The variable an expression reads and the keys it reads below it, through filters
    and tests: ``message['content']|trim`` -> ("message", ["content"]); ``messages[1:]``
    -> ("messages", [slice]); an index that is not a constant string is ``int``."""
    import jinja2.nodes as n

    keys: list = []
    while True:
        if isinstance(node, (n.Filter, n.Test)):
            node = node.node
        elif isinstance(node, n.Getattr):
            keys.append(node.attr)
            node = node.node
        elif isinstance(node, n.Getitem):
            arg = node.arg
            if isinstance(arg, n.Slice):
                keys.append(slice)
            elif isinstance(arg, n.Const) and isinstance(arg.value, str):
                keys.append(arg.value)
            else:
                keys.append(int)
            node = node.node
        elif isinstance(node, n.Name):
            return node.name, keys[::-1]
        else:
            return None, []


def _loops_over_content(ast) -> bool:
    """Whether the template has a ``for`` loop over a message's ``content``: names bound
    to the message list (``messages`` and its slices), to one message (a loop variable
    over the list, or an item of it) and to a content (``set c = message['content']``)
    are followed in document order."""
    import jinja2.nodes as n

    lists, items, contents = {"messages"}, set(), set()

    def kind(expr) -> str | None:
        """ "list", "item" or "content": what ``expr`` reads, None for anything else."""
        name, keys = _chain(expr)
        keys = [k for k in keys if k is not slice]  # a slice of the list is a list
        is_item = name in items
        if name in lists:
            if not keys:
                return "list"
            is_item, keys = True, keys[1:]  # messages[i]
        if is_item:
            if not keys:
                return "item"
            return "content" if keys == ["content"] else None
        return "content" if name in contents and not keys else None

    for node in ast.find_all((n.For, n.Assign)):
        target = node.target
        if not isinstance(target, n.Name):
            continue
        what = kind(node.iter if isinstance(node, n.For) else node.node)
        if isinstance(node, n.For):
            if what == "content":
                return True
            if what == "list":
                items.add(target.name)
        elif what is not None:
            {"list": lists, "item": items, "content": contents}[what].add(target.name)
    return False
