"""``/tokenize`` over the chat handler of a stub engine with a tiny context (8 tokens):
a prompt or chat messages far longer than the context are tokenized and counted, as
upstream (counting is what a client calls it for before cutting a text to fit), while
the completion and chat endpoints keep refusing such a text before tokenizing it.

Guards: /tokenize answered 400 ("maximum context length") for a text of more than
``max_model_len x`` (longest vocabulary entry) characters, and 200 for shorter texts
of more than ``max_model_len`` tokens.
"""

import asyncio

import pytest

from tests.entrypoints.openai.stub_engine import StubEngine
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_tokenization import (
    OpenAIServingTokenization,
    TokenizeRequest,
)

TEMPLATE = "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
LONG = "hello " * 400  # 2400 characters: more than 8 tokens x the longest entry


class _Engine(StubEngine):
    """The stub engine with an 8-token context."""

    max_model_len = 8


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture()
def chat(tokenizer):
    handler = OpenAIServingChat(_Engine(tokenizer), ["m"], chat_template=TEMPLATE)
    # the premise: this text is over the characters-per-token bound of the 8-token context
    assert handler.max_chars_per_token is not None
    assert len(LONG) > handler.max_model_len * handler.max_chars_per_token
    return handler


def test_tokenize_counts_text_longer_than_the_context(chat, tokenizer):
    tok = OpenAIServingTokenization(chat)
    want = tokenizer.encode(LONG)
    got = asyncio.run(tok.tokenize(TokenizeRequest(model="m", prompt=LONG)))
    assert got.tokens == want and got.count == len(want) > 8 == got.max_model_len

    messages = [{"role": "user", "content": LONG}]
    got = asyncio.run(tok.tokenize(TokenizeRequest(model="m", messages=messages)))
    want = tokenizer.encode(f"<user>{LONG}", add_special_tokens=False)
    assert got.tokens == want and got.count == len(want)


def test_generation_still_refuses_text_longer_than_the_context(chat):
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": LONG}])
    with pytest.raises(APIError, match="maximum context length is 8 tokens") as e:
        asyncio.run(chat.create_chat_completion(req, None))
    assert e.value.code == 400
