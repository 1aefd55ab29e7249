"""Think-tag reasoning parsers: ``deepseek_r1``, ``glm45`` and ``qwen3`` (upstream's
names).

All read the reply's text, in which the model wraps its reasoning in ``<think>`` ...
``</think>`` and answers after the closing tag. They differ where the tags are missing:

- ``deepseek_r1`` (DeepSeek-R1 and its distills, QwQ): the reply starts in reasoning, with
  or without an opening ``<think>`` (R1's template writes that tag into the prompt), so
  everything up to ``</think>`` is reasoning; a reply cut before ``</think>`` is all
  reasoning and has no content.
- ``qwen3`` (Qwen3 hybrid models): a reply that does not start with ``<think>`` has no
  reasoning (``enable_thinking=False`` in ``chat_template_kwargs``, say) and is all
  content; one that does is reasoning up to ``</think>`` (all of it when cut before).
- ``glm45`` (GLM-4.5 / 4.5-Air / 4.6): qwen3's rule. The model opens ``<think>`` itself;
  with thinking disabled (``enable_thinking=False``) its template writes an empty
  ``<think></think>`` into the prompt and the reply, which has no tags, is all content.

The tags themselves belong to neither part. Whitespace around the parts is kept as the
model wrote it (R1's ``</think>\\n\\n`` leaves the answer starting with two newlines), and
an empty part is None.

Streaming (:class:`ReasoningStream`) splits the text generated so far by the same rule,
holding back a tail that may still become a tag (``</thi``), and emits what each part
grew by, so the joined deltas equal the one-shot split of the final text.
"""

from __future__ import annotations

from vllm.utils.text_utils import partial_marker_len

START, END = "<think>", "</think>"


class ReasoningParser:
    """One parser: ``starts_in_reasoning`` says whether a reply without an opening tag
    starts in reasoning (deepseek_r1) or is all content (qwen3, glm45)."""

    def __init__(self, name: str, starts_in_reasoning: bool):
        self.name = name
        self.starts_in_reasoning = starts_in_reasoning

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """``(reasoning, content)`` of ``text`` ("" for an empty part). With ``final``
        False (a reply still streaming) a tail that may still become a tag, or the
        whole text while it may still become the opening tag, is left out of both."""
        body = text.lstrip()
        if not final and len(body) < len(START) and START.startswith(body):
            return "", ""  # "", "<", "<th": the opening tag may be coming
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        elif not self.starts_in_reasoning:
            return "", text  # qwen3 without <think>: no reasoning
        else:
            body = text  # deepseek_r1: reasoning from the first character
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END) :]
        held = 0 if final else partial_marker_len(body, END)
        return body[: len(body) - held], ""

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of a finished reply, each None when empty."""
        reasoning, content = self.split(text)
        return reasoning or None, content or None

    def tag_ids(self, tokenizer) -> tuple[int, int] | None:
        """The ids of ``<think>`` and ``</think>`` when ``tokenizer`` has each as one token
        (upstream's parsers need them so), else None. The engine waits for the end id
        before a constrained reply's grammar starts (see
        ``GuidedDecodingParams.reasoning_token_ids``)."""
        vocab = tokenizer.get_vocab()
        start, end = vocab.get(START), vocab.get(END)
        return None if start is None or end is None else (start, end)

    def until_end_tag(self) -> ReasoningParser:
        """This parser for a reply whose structured-output grammar waits for the end tag
        (``GuidedDecodingParams.reasoning_token_ids``): the engine treats everything
        before ``</think>`` as reasoning, with or without an opening tag, so the split
        does too (a qwen3 reply of a template that wrote ``<think>`` into the prompt
        generates only ``</think>``)."""
        return ReasoningParser(self.name, starts_in_reasoning=True)

    def stream(self) -> ReasoningStream:
        """A fresh splitter for one streamed choice."""
        return ReasoningStream(self)


class ReasoningStream:
    """Splits one choice's streamed text: :meth:`delta` takes each new piece and returns
    what the reasoning and the content grew by."""

    def __init__(self, parser: ReasoningParser):
        self.parser = parser
        self.text = ""
        self.sent = (0, 0)  # characters of reasoning and content already returned

    def delta(self, piece: str, finished: bool) -> tuple[str, str]:
        """Add ``piece`` (``finished``: the reply's last) and return ``(reasoning delta,
        content delta)``, each "" when that part did not grow."""
        self.text += piece
        reasoning, content = self.parser.split(self.text, final=finished)
        out = reasoning[self.sent[0] :], content[self.sent[1] :]
        self.sent = (max(self.sent[0], len(reasoning)), max(self.sent[1], len(content)))
        return out


_PARSERS = {
    "deepseek_r1": ReasoningParser("deepseek_r1", starts_in_reasoning=True),
    "glm45": ReasoningParser("glm45", starts_in_reasoning=False),
    "qwen3": ReasoningParser("qwen3", starts_in_reasoning=False),
}


def reasoning_parser_names() -> list[str]:
    """The names ``--reasoning-parser`` takes."""
    return sorted(_PARSERS)


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser called ``name``.

    Raises:
        ValueError: an unknown name (listing the known ones).
    """
    if name not in _PARSERS:
        raise ValueError(
            f"--reasoning-parser {name!r} is not known; use one of "
            f"{', '.join(reasoning_parser_names())}."
        )
    return _PARSERS[name]
