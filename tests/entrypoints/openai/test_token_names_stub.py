"""How logprobs name tokens with ``--return-tokens-as-token-ids`` (the handlers'
``return_tokens_as_token_ids``) and the request field of the same name, over a stub
engine that replays one token with its logprobs: the request's value wins either way
(true: ``token_id:ID``; false: the token's text), and without it the server's flag
decides, on /v1/completions (streamed or not) and /v1/chat/completions alike, as upstream.

Guards: a completion request's ``"return_tokens_as_token_ids": false`` ignored on a
server started with the flag (tokens still named ``token_id:ID``), unlike chat.
"""

import asyncio
import json

import pytest

from tests.entrypoints.openai.stub_engine import StubEngine
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sequence import Logprob

TEMPLATE = "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
TOKEN_ID = 5


class _Engine(StubEngine):
    """The stub engine; generate() replays token TOKEN_ID with its logprob."""

    async def generate(self, prompt, params, rid, lora_request=None, priority=0, **kw):
        text = self.tokenizer.decode([TOKEN_ID])
        lps = [{TOKEN_ID: Logprob(-0.5, 1, text)}]
        out = CompletionOutput(0, text, [TOKEN_ID], -0.5, lps, "length")
        yield RequestOutput(
            rid, prompt.get("prompt"), prompt["prompt_token_ids"], None, [out], True
        )


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _token_name(tokenizer, api: str, flag: bool, field, stream: bool = False) -> str:
    """The name the reply's logprobs give the generated token."""
    engine = _Engine(tokenizer)
    body = {"model": "m", "max_tokens": 1, "return_tokens_as_token_ids": field, "stream": stream}
    if api == "chat":
        handler = OpenAIServingChat(
            engine, ["m"], chat_template=TEMPLATE, return_tokens_as_token_ids=flag
        )
        req = ChatCompletionRequest(
            messages=[{"role": "user", "content": "Hi"}], logprobs=True, **body
        )
        create = handler.create_chat_completion
    else:
        handler = OpenAIServingCompletion(engine, ["m"], return_tokens_as_token_ids=flag)
        req = CompletionRequest(prompt="Hi there", logprobs=1, **body)
        create = handler.create_completion

    async def run():
        result = await create(req, None)
        if not stream:
            return result.model_dump()["choices"][0]["logprobs"]
        chunks = [json.loads(c[len("data: ") :]) async for c in result if "[DONE]" not in c]
        return next(c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"])

    lp = asyncio.run(run())
    return lp["content"][0]["token"] if api == "chat" else lp["tokens"][0]


@pytest.mark.parametrize("api, stream", [("completion", False), ("completion", True),
                                         ("chat", False), ("chat", True)])  # fmt: skip
def test_request_field_wins_over_the_server_flag(tokenizer, api, stream):
    text = tokenizer.decode([TOKEN_ID])
    assert text != f"token_id:{TOKEN_ID}"
    for flag, field, want in (
        (True, False, text),
        (True, None, f"token_id:{TOKEN_ID}"),
        (True, True, f"token_id:{TOKEN_ID}"),
        (False, True, f"token_id:{TOKEN_ID}"),
        (False, None, text),
        (False, False, text),
    ):
        assert _token_name(tokenizer, api, flag, field, stream) == want, (flag, field)
