"""Completion and chat request fields read as upstream reads them, over a stub engine that
replays fixed text pieces: ``"n": null`` and ``"stream": null`` (both APIs) and a
completion's ``"echo": null`` mean the fields' defaults (one choice, not streamed, no
echo); ``echo`` with ``max_tokens`` 0 takes a prompt of the whole context (nothing is
generated), and one token longer is a 400 counting 0 completion tokens; a non-empty
``logits_processors`` is a 400 naming it (upstream's server refuses them unless started
with ``--logits-processor-pattern``), an empty one is accepted; ``logit_bias`` values
beyond [-100, 100] are clamped to it, as upstream's server clamps them.

Guards: echo with max_tokens 0 refused for a prompt of max_model_len tokens ("you
requested 513 tokens (512 in the prompt, 1 in the completion)"); a body with such nulls
refused with a 400 ("n: Input should be a valid integer") although upstream vLLM serves
it; ``logits_processors`` ignored (the reply generated without them, as if they had
run); ``logit_bias`` of 1e9 (a client forcing a token) refused with a 400 although
upstream serves it with the bias clamped to 100.
"""

import asyncio
from types import SimpleNamespace

import pytest

from tests.entrypoints.openai.stub_engine import ReplayEngine
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion

TEMPLATE = "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
PIECES = ["Par", "is"]


class _Engine(ReplayEngine):
    """The replaying stub engine, with ``PIECES``."""

    pieces = PIECES


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def _answer(tokenizer, api: str, **nulls) -> tuple[dict, object]:
    """The non-streamed reply to a body with ``nulls`` and the SamplingParams it ran."""
    engine = _Engine(tokenizer)
    body = {"model": "m", "max_tokens": 8, **nulls}
    if api == "chat":
        handler = OpenAIServingChat(engine, ["m"], chat_template=TEMPLATE)
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], **body)
        create = handler.create_chat_completion
    else:
        handler = OpenAIServingCompletion(engine, ["m"])
        req = CompletionRequest(prompt="Hi there", **body)
        create = handler.create_completion
    reply = asyncio.run(create(req, None))
    return reply.model_dump(), engine.params


@pytest.mark.parametrize("api", ["completion", "chat"])
def test_null_n_and_stream_are_the_defaults(tokenizer, api):
    reply, params = _answer(tokenizer, api, n=None, stream=None)
    assert params.n == 1
    assert len(reply["choices"]) == 1 and reply["choices"][0]["index"] == 0
    text = reply["choices"][0]["text" if api == "completion" else "message"]
    assert (text if api == "completion" else text["content"]) == "Paris"


def test_null_echo_is_false(tokenizer):
    reply, _ = _answer(tokenizer, "completion", echo=None)
    assert reply["choices"][0]["text"] == "Paris"  # no prompt in front


@pytest.mark.parametrize("api", ["completion", "chat"])
@pytest.mark.parametrize("beam", [False, True])
def test_logits_processors_are_refused(tokenizer, api, beam):
    procs = ["my_module.MyLogitsProcessor"]
    with pytest.raises(APIError) as err:
        _answer(tokenizer, api, logits_processors=procs, use_beam_search=beam)
    assert err.value.code == 400 and err.value.param == "logits_processors"
    assert err.value.message.startswith("logits_processors are not supported by this server")
    reply, _ = _answer(tokenizer, api, logits_processors=[])
    assert len(reply["choices"]) == 1


def test_echo_without_tokens_takes_a_whole_context_prompt(tokenizer):
    """A prompt of max_model_len (512 in the stub) token ids echoed with max_tokens 0."""
    engine = _Engine(tokenizer)
    engine.model_config = SimpleNamespace(vocab_size=len(tokenizer))
    handler = OpenAIServingCompletion(engine, ["m"])
    ids = [tokenizer.convert_tokens_to_ids("a")] * engine.max_model_len

    def answer(prompt):
        req = CompletionRequest(model="m", prompt=prompt, max_tokens=0, echo=True)
        return asyncio.run(handler.create_completion(req, None)).model_dump()

    reply = answer(ids)
    assert reply["choices"][0]["text"] == tokenizer.decode(ids)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] == 512 and reply["usage"]["completion_tokens"] == 0
    assert engine.params.max_tokens == 1  # the engine's one token, dropped from the reply
    with pytest.raises(APIError) as err:
        answer(ids + ids[:1])
    assert err.value.param == "prompt"
    assert "requested 513 tokens (513 in the prompt, 0 in the completion)" in err.value.message


@pytest.mark.parametrize("api", ["completion", "chat"])
def test_logit_bias_values_are_clamped(tokenizer, api):
    bias = {"5": 1e9, "6": -500, "7": 2.5, "8": 100}
    reply, params = _answer(tokenizer, api, logit_bias=bias)
    assert params.logit_bias == {5: 100.0, 6: -100.0, 7: 2.5, 8: 100.0}
    assert len(reply["choices"]) == 1
    with pytest.raises(APIError) as err:  # a key that is no token id is still a 400
        _answer(tokenizer, api, logit_bias={"abc": 1e9})
    assert err.value.code == 400 and err.value.param == "logit_bias"
