"""Which usage a completion or chat stream carries, over a stub engine that replays fixed
text pieces, one per token: ``stream_options.include_usage`` (true by default when
``stream_options`` is given, as upstream) adds the final usage-only chunk, and
``continuous_usage_stats`` puts the usage so far on every chunk only together with it (or
with ``--enable-force-include-usage``), for both APIs alike, as upstream.

Guards: a completion stream with ``{"include_usage": false, "continuous_usage_stats":
true}`` sent the usage on every chunk, unlike the chat stream and upstream.
"""

import asyncio
import json

import pytest

from tests.entrypoints.openai.stub_engine import ReplayEngine
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion

TEMPLATE = "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
PIECES = ["Hello", " world", "!"]


class _Engine(ReplayEngine):
    """The replaying stub engine, with ``PIECES``."""

    pieces = PIECES


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _stream(tokenizer, api: str, stream_options, force: bool = False) -> list[dict]:
    """The JSON chunks of one streamed request (``[DONE]`` checked and dropped)."""
    engine = _Engine(tokenizer)
    body = {"model": "m", "max_tokens": 8, "stream": True, "stream_options": stream_options}
    if api == "chat":
        handler = OpenAIServingChat(
            engine, ["m"], chat_template=TEMPLATE, enable_force_include_usage=force
        )
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], **body)
        create = handler.create_chat_completion
    else:
        handler = OpenAIServingCompletion(engine, ["m"], enable_force_include_usage=force)
        req = CompletionRequest(prompt="Hi there", **body)
        create = handler.create_completion

    async def run():
        chunks = [c async for c in await create(req, None)]
        assert chunks[-1] == "data: [DONE]\n\n"
        return [json.loads(c[len("data: ") :]) for c in chunks[:-1]]

    return asyncio.run(run())


@pytest.mark.parametrize("api", ["completion", "chat"])
def test_continuous_usage_needs_include_usage(tokenizer, api):
    """include_usage false: no chunk carries usage, continuous_usage_stats or not."""
    for opts in (
        {"include_usage": False},
        {"include_usage": False, "continuous_usage_stats": True},
    ):
        chunks = _stream(tokenizer, api, opts)
        assert all(c["choices"] for c in chunks), opts  # no usage-only chunk
        assert [c.get("usage") for c in chunks] == [None] * len(chunks), opts


@pytest.mark.parametrize("api", ["completion", "chat"])
@pytest.mark.parametrize("force", [False, True])
def test_continuous_usage_counts_every_token(tokenizer, api, force):
    """continuous_usage_stats with include_usage (its default, or forced by the server
    flag): every chunk has the usage so far, and a final chunk the whole of it."""
    opts = {"continuous_usage_stats": True}
    if force:
        opts["include_usage"] = False  # --enable-force-include-usage wins, as upstream
    chunks = _stream(tokenizer, api, opts, force=force)
    prompt = chunks[0]["usage"]["prompt_tokens"]
    assert prompt > 0
    first = 1 if api == "chat" else 0  # the chat's first chunk has only the role
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [0] * first + [1, 2, 3]
    assert all(c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"]
               for c in chunks)  # fmt: skip
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(PIECES)
