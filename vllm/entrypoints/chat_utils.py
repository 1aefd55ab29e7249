"""Chat templates: ``--chat-template`` (a file or an inline Jinja string) and rendering a
conversation to the prompt text the model sees."""

from __future__ import annotations

import os

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


def render_chat(
    tokenizer, conversation: list[dict], template: str | None, add_generation_prompt: bool
) -> str:
    """The prompt text of ``conversation`` (``[{"role", "content"}, ...]``) under
    ``template`` (None: the tokenizer's own). Tokenize it with ``add_special_tokens=False``:
    the template writes the special tokens itself."""
    return tokenizer.apply_chat_template(
        conversation,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
