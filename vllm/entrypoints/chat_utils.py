"""Chat templates: ``--chat-template`` (a file or an inline Jinja string), the messages a
template sees, and rendering a conversation to the prompt text the model sees.

Messages reach the template as OpenAI sends them, text only: ``role``, ``content`` (a
list of text parts becomes their texts joined by newlines, as upstream vLLM renders it),
and where given ``name``, an assistant's ``tool_calls`` (each call's ``function.arguments``
decoded from its JSON text to an object, the form tool-use templates iterate over) and a
tool message's ``tool_call_id``. The request's ``tools`` and ``chat_template_kwargs`` are
template variables as well.
"""

from __future__ import annotations

import json
import os
from typing import Any

# A value containing any of these is Jinja, not a path.
_JINJA_MARKS = ("{{", "{%", "{#", "\n")


def load_chat_template(value: str | None) -> str | None:
    """The template text for ``--chat-template``: the contents of the file ``value`` names,
    or ``value`` itself when it is inline Jinja; None stays None (the tokenizer's own).

    Raises:
        ValueError: ``value`` is neither an existing file nor Jinja (a mistyped path), or
            the file cannot be read.
    """
    if value is None:
        return None
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as fh:
                return fh.read()
        except OSError as e:
            raise ValueError(f"--chat-template file {value!r} could not be read: {e}.") from e
    if any(mark in value for mark in _JINJA_MARKS):
        return value
    raise ValueError(
        f"--chat-template {value!r} is neither an existing file nor a Jinja template "
        "(inline templates contain '{{' or '{%')."
    )


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


def _content_text(content: Any, i: int) -> str:
    """A message's text: a string as given, a list of text parts joined by "\\n" (upstream
    vLLM's rendering, so ``[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]``
    is ``"a\\nb"``); a content part other than text is refused (this engine is text-only),
    never silently dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
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
    return "\n".join(texts)


def _tool_call(call: dict, i: int, j: int) -> dict:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError as e:
            raise ChatInputError(
                f"messages[{i}].tool_calls[{j}].function.arguments is not JSON ({e}): "
                f"{args[:80]!r}.",
                f"messages.{i}.tool_calls.{j}.function.arguments",
            ) from None
    return {**call, "function": fn}


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages a chat template sees (see the module docstring).

    Args:
        messages: OpenAI chat messages as dicts (``role``, ``content`` as a string or a
            list of text parts, optional ``name``, ``tool_calls``, ``tool_call_id``).
    Raises:
        ChatInputError: a content part that is not text, or tool-call arguments that are
            not JSON.
    """
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m["role"], "content": _content_text(m.get("content"), i)}
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
    clash = sorted(RESERVED_TEMPLATE_KWARGS & set(chat_template_kwargs or {}))
    if clash:
        raise ChatInputError(
            f"chat_template_kwargs must not set {clash}: they are arguments of their own "
            "(send them as request fields).",
            "chat_template_kwargs",
        )


def render_chat(
    tokenizer,
    conversation: list[dict],
    template: str | None,
    add_generation_prompt: bool,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
) -> str:
    """The prompt text of ``conversation`` (from :func:`template_messages`) under
    ``template`` (None: the tokenizer's own), with ``tools`` and ``chat_template_kwargs``
    as template variables. With ``continue_final_message`` the text ends where the last
    message's content ends (no end-of-turn marker), so the model continues that message.
    Tokenize it with ``add_special_tokens=False``: the template writes the special tokens
    itself."""
    return tokenizer.apply_chat_template(
        conversation,
        tools=tools or None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **(chat_template_kwargs or {}),
    )
