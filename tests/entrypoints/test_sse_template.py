"""Streamed chunks built from a template equal pydantic's dump of the same response, byte for
byte, for texts that need escaping (quotes, backslashes, control characters, non-ASCII,
surrogate-pair emoji, the line separators JSON leaves alone)."""

import pytest

from vllm.entrypoints.openai.protocol import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    CompletionStreamChoice,
    CompletionStreamResponse,
    DeltaMessage,
)
from vllm.entrypoints.openai.sse_template import TextChunks, TextChunkTemplate

TEXTS = ["", " Paris", 'say "hi"', "back\\slash", "line\nbreak\ttab\r", "\x00\x01\x1f\x7f",
         "caf\u00e9 \u4e2d\u6587", "\U0001f600 emoji", "\u2028\u2029", "</script>", "\ufffd",
         "a/b"]  # fmt: skip


def _completion(text):
    choice = CompletionStreamChoice(index=3, text=text)
    return CompletionStreamResponse(id="cmpl-1", created=7, model="m", choices=[choice])


def _chat(text):
    choice = ChatCompletionStreamChoice(index=1, delta=DeltaMessage(content=text))
    return ChatCompletionStreamResponse(id="chatcmpl-1", created=7, model="m", choices=[choice])


@pytest.mark.parametrize("make", [_completion, _chat])
def test_template_chunks_equal_pydantic_dumps(make):
    template = TextChunkTemplate(make(TextChunkTemplate.MARKER))
    for text in TEXTS:
        assert template.format(text) == f"data: {make(text).model_dump_json()}\n\n", repr(text)


def test_marker_must_occur_once():
    with pytest.raises(ValueError, match="exactly once.*0 times"):
        TextChunkTemplate(_completion("no marker"))


def test_text_chunks_keep_one_template_per_choice():
    def make(index, text):
        choice = CompletionStreamChoice(index=index, text=text)
        return CompletionStreamResponse(id="cmpl-1", created=7, model="m", choices=[choice])

    chunks = TextChunks(make)
    for index, text in [(0, "a"), (2, 'q"uote'), (0, "\n"), (2, "")]:
        assert chunks.format(index, text) == f"data: {make(index, text).model_dump_json()}\n\n"
    assert sorted(chunks._templates) == [0, 2]
