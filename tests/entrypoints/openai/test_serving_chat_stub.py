"""The chat handler over a stub engine that replays fixed text pieces, one per token:
OpenAI's stream shape (first delta {"role", "content": ""}, later deltas only what they
set, one chunk per token for text, none for a held tool-call token), tool_choice "auto"
with the hermes parser (non-streamed and streamed) and with the glm45 parser typing
values by the request's tools, "required" streamed without empty chunks, echo and the
reply role with continue_final_message, the 400 for
continue_final_message together with add_generation_prompt, ``add_special_tokens`` (chat
and completions: whether the tokenizer's own special tokens are added to the prompt),
``return_token_ids`` while a tool parser holds tokens back, ``documents`` reaching the
template, token-limit errors naming the field sent, the 400 for a grammar xgrammar
cannot read, parallel_tool_calls false, and the handler's options behind
--exclude-tools-when-tool-choice-none and --default-chat-template-kwargs."""

import asyncio
import json
import logging
import sys

import pytest

from tests.entrypoints.openai.stub_engine import StubEngine
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.tool_parsers import get_tool_parser
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.reasoning import get_reasoning_parser

TEMPLATE = "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
HERMES = ["Let me ", "check.", " <tool", "_call>", CALL[11:40], CALL[40:]]


class _Engine(StubEngine):
    """The stub engine; generate() replays ``pieces``."""

    def __init__(self, tokenizer, pieces, default_sampling=None, finish="stop"):
        super().__init__(tokenizer)
        self.pieces, self.finish = pieces, finish
        self.request_ids = []
        self.default_sampling = default_sampling or {}

    async def generate(self, prompt, params, rid, lora_request=None, priority=0, **kw):
        self.request_ids.append(rid)
        self.params, self.prompt = params, prompt
        for k in range(1, len(self.pieces) + 1):
            done = k == len(self.pieces)
            out = CompletionOutput(
                0,
                "".join(self.pieces[:k]),
                list(range(k)),
                None,
                None,
                self.finish if done else None,
            )
            yield RequestOutput(
                rid, prompt["prompt"], prompt["prompt_token_ids"], None, [out], done
            )


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


class _BosTokenizer:
    """``tokenizer`` whose own special tokens are one BOS id (BOS_ID) before the text, as
    a Llama tokenizer adds (the tiny models' SmolLM2 tokenizer adds none)."""

    BOS_ID = 7

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def encode(self, text, add_special_tokens=True):
        ids = self._tok.encode(text, add_special_tokens=False)
        return [self.BOS_ID, *ids] if add_special_tokens else ids


def _answer(tokenizer, pieces, parser=None, role="assistant", reasoning=None, engine=None,
            tags=None, **body):  # fmt: skip
    """The reply to ``body`` of a handler over a stub engine that replays ``pieces``;
    ``tags``: the server's reasoning tag ids (constraints then wait for the end tag)."""
    handler = OpenAIServingChat(
        engine or _Engine(tokenizer, pieces),
        ["m"],
        chat_template=TEMPLATE,
        tool_parser=parser,
        response_role=role,
        reasoning_parser=get_reasoning_parser(reasoning) if reasoning else None,
        reasoning_token_ids=tags,
        trust_request_chat_template=True,  # some bodies bring their own template
    )
    req = ChatCompletionRequest(**{"messages": MSGS, "max_tokens": 32, **body})

    async def run():
        result = await handler.create_chat_completion(req, None)
        if not req.stream:
            return result.model_dump()
        chunks = [c async for c in result]
        assert chunks[-1] == "data: [DONE]\n\n"
        return [json.loads(c[len("data: ") :]) for c in chunks[:-1]]

    return asyncio.run(run())


def test_stream_shape_follows_openai(tokenizer):
    chunks = _answer(tokenizer, ["Hello", "", " world", "!"], stream=True)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": ""},  # a token without text of its own (e.g. half a character)
        {"content": " world"},
        {"content": "!"},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["stop"]
    whole = _answer(tokenizer, ["Hello", "", " world", "!"])
    assert whole["choices"][0]["message"]["content"] == "Hello world!"


def test_required_stream_sends_no_empty_chunks(tokenizer):
    pieces = ['[{"name": ', '"get_weather", ', '"parameters": ', '{"city": "Paris"}}]']
    chunks = _answer(tokenizer, pieces, tools=TOOLS, tool_choice="required", stream=True)
    assert len(chunks) == 2, chunks
    first, last = (c["choices"][0] for c in chunks)
    assert first["delta"] == {"role": "assistant", "content": ""}
    [call] = last["delta"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert last["finish_reason"] == "tool_calls"


def test_auto_hermes_calls_not_streamed_and_streamed(tokenizer):
    hermes = get_tool_parser("hermes")
    r = _answer(tokenizer, HERMES, hermes, tools=TOOLS)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check. "
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

    chunks = _answer(tokenizer, HERMES, hermes, tools=TOOLS, stream=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[:4] == [
        {"role": "assistant", "content": ""},
        {"content": "Let me "},
        {"content": "check."},
        {"content": " "},
    ]
    assert len(deltas) == 5 and list(deltas[4]) == ["tool_calls"]
    [streamed] = deltas[4]["tool_calls"]
    assert streamed["function"] == call["function"] and streamed["index"] == 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # without tools (or with tool_choice "none") the text is the content
    r = _answer(tokenizer, HERMES, hermes, tools=TOOLS, tool_choice="none")
    assert r["choices"][0]["message"]["content"] == "".join(HERMES)
    assert r["choices"][0]["message"]["tool_calls"] == []


GLM_TOOLS = [{"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object",
    "properties": {"label": {"type": "string"}, "minutes": {"type": "integer"}},
}}}]  # fmt: skip
GLM45 = ["Setting it.", "\n<tool_call>", "set_alarm\n", "<arg_key>label</arg_key>",
         "\n<arg_value>123</arg_value>\n", "<arg_key>minutes</arg_key>\n",
         "<arg_value>123</arg_value>\n", "</tool_call>"]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_auto_glm45_values_follow_the_requests_tools(tokenizer, stream):
    """The glm45 parser gets the request's tools: "123" of the string parameter stays a
    string, that of the integer one becomes 123, streamed and not."""
    out = _answer(tokenizer, GLM45, get_tool_parser("glm45"), tools=GLM_TOOLS, stream=stream)
    if stream:
        deltas = [c["choices"][0]["delta"] for c in out]
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
        finish = out[-1]["choices"][0]["finish_reason"]
    else:
        choice = out["choices"][0]
        content, calls = choice["message"]["content"], choice["message"]["tool_calls"]
        finish = choice["finish_reason"]
    assert content == "Setting it.\n" and finish == "tool_calls"
    [call] = calls
    assert call["function"] == {
        "name": "set_alarm",
        "arguments": '{"label": "123", "minutes": 123}',
    }


def test_echo_and_continue_final_message(tokenizer):
    msgs = [*MSGS, {"role": "assistant", "content": "It is"}]
    body = dict(messages=msgs, add_generation_prompt=False, continue_final_message=True)
    r = _answer(tokenizer, [" sunny", "."], echo=True, **body)
    assert r["choices"][0]["message"] == {
        "role": "assistant",
        "content": "It is sunny.",
        "reasoning": None,
        "tool_calls": [],
    }
    chunks = _answer(tokenizer, [" sunny", "."], echo=True, stream=True, **body)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "It is"},
        {"content": " sunny"},
        {"content": "."},
    ]
    # the reply's role is the last message's without a generation prompt; echo needs it
    r = _answer(tokenizer, ["x"], echo=True, add_generation_prompt=False)
    assert r["choices"][0]["message"]["role"] == "user"
    assert r["choices"][0]["message"]["content"] == "Weather in Paris?x"
    r = _answer(tokenizer, ["x"], echo=True)
    assert r["choices"][0]["message"]["content"] == "x"
    # --response-role names the reply to a generation prompt, streamed and not
    assert _answer(tokenizer, ["x"], role="bot")["choices"][0]["message"]["role"] == "bot"
    chunks = _answer(tokenizer, ["x"], role="bot", stream=True)
    assert chunks[0]["choices"][0]["delta"] == {"role": "bot", "content": ""}
    with pytest.raises(APIError) as exc:
        _answer(tokenizer, ["x"], messages=msgs, continue_final_message=True)
    assert exc.value.code == 400 and exc.value.param == "continue_final_message"


def test_generation_config_defaults_fill_what_the_request_leaves_out(tokenizer):
    """The engine's generation-config defaults (``--generation-config``) apply to fields
    a request leaves out; what a request sets wins, but max_new_tokens caps every budget
    (upstream's get_max_tokens: the minimum of the request's, the context's and it)."""
    defaults = {"temperature": 0.3, "top_p": 0.8, "top_k": 20, "max_tokens": 5}
    handler = OpenAIServingChat(_Engine(tokenizer, [], defaults), ["m"], chat_template=TEMPLATE)
    req = ChatCompletionRequest(messages=MSGS, temperature=0.9)
    p = handler.sampling_params(req, handler.check_length(10, None, "messages"), None)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (0.9, 0.8, 20, 0.0, 5)
    assert handler.check_length(10, 3, "messages") == 3  # a request's own max_tokens
    assert handler.check_length(10, 7, "messages") == 5  # capped by max_new_tokens
    plain = OpenAIServingChat(_Engine(tokenizer, []), ["m"], chat_template=TEMPLATE)
    p = plain.sampling_params(ChatCompletionRequest(messages=MSGS), 502, None)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, -1, 502)


class _NoGrammarEngine(_Engine):
    """A server without xgrammar: compiling a constraint fails as the real compiler does."""

    async def prepare_grammar(self, params):
        from vllm.model_executor.guided_decoding import compiler

        compiler.parse_grammar(params.guided_decoding)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"regex": "a+"}},
        {"tools": TOOLS, "tool_choice": "required"},
    ],
)
def test_missing_xgrammar_is_a_400_naming_the_package(tokenizer, monkeypatch, body, stream):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # makes `import xgrammar` fail
    engine = _NoGrammarEngine(tokenizer, ["x"])
    handler = OpenAIServingChat(engine, ["m"], chat_template=TEMPLATE)
    req = ChatCompletionRequest(messages=MSGS, max_tokens=4, stream=stream, **body)
    with pytest.raises(APIError) as err:
        asyncio.run(handler.create_chat_completion(req, None))
    assert err.value.code == 400
    assert "need the xgrammar package" in err.value.message
    assert "pip install --no-deps xgrammar==" in err.value.message
    assert engine.request_ids == []  # nothing was queued


def test_unexpected_error_is_a_logged_500(caplog):
    from vllm.entrypoints.openai.api_errors import to_api_error

    def fail():
        raise RuntimeError("boom in a handler")

    try:
        fail()
    except RuntimeError as e:
        raised = e
        with caplog.at_level(logging.ERROR, logger="vllm.entrypoints.openai.api_errors"):
            err = to_api_error(e)
    assert (err.code, err.message) == (500, "RuntimeError: boom in a handler")
    [rec] = caplog.records
    assert rec.exc_info[1] is raised and "in fail" in caplog.text  # the traceback is logged


R1 = ["<think>", "Rain is", " likely", ".</th", "ink>", "\n\nTake", " an umbrella."]


def test_reasoning_split_streamed_and_not(tokenizer):
    """--reasoning-parser deepseek_r1: the reply's <think> text is ``reasoning``, the rest
    ``content``; streamed, reasoning deltas come first, no tag text in any delta, and the
    joined deltas equal the whole reply's fields."""
    r = _answer(tokenizer, R1, reasoning="deepseek_r1")
    msg = r["choices"][0]["message"]
    assert (msg["reasoning"], msg["content"]) == ("Rain is likely.", "\n\nTake an umbrella.")
    chunks = _answer(tokenizer, R1, reasoning="deepseek_r1", stream=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning": "Rain is"},
        {"reasoning": " likely"},
        {"reasoning": "."},  # ".</th" holds back its possible tag
        {"content": "\n\nTake"},
        {"content": " an umbrella."},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # include_reasoning false: the reasoning is dropped, the content unchanged
    r = _answer(tokenizer, R1, reasoning="deepseek_r1", include_reasoning=False)
    assert r["choices"][0]["message"]["reasoning"] is None
    assert r["choices"][0]["message"]["content"] == "\n\nTake an umbrella."
    chunks = _answer(tokenizer, R1, reasoning="deepseek_r1", include_reasoning=False, stream=True)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == msg["content"]
    assert not any("reasoning" in c["choices"][0]["delta"] for c in chunks)
    # a reply cut inside its reasoning: no content at all
    cut = _answer(tokenizer, R1[:3], reasoning="deepseek_r1")["choices"][0]["message"]
    assert (cut["reasoning"], cut["content"]) == ("Rain is likely", None)


def test_reasoning_then_tool_call(tokenizer):
    """With both parsers, tool calls are parsed from the content after the reasoning."""
    pieces = ["<think>Need", " the weather", ".</think>", *HERMES]
    hermes = get_tool_parser("hermes")
    r = _answer(tokenizer, pieces, hermes, reasoning="qwen3", tools=TOOLS)
    choice = r["choices"][0]
    assert choice["message"]["reasoning"] == "Need the weather."
    assert choice["message"]["content"] == "Let me check. "
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chunks = _answer(tokenizer, pieces, hermes, reasoning="qwen3", tools=TOOLS, stream=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Need the weather."
    assert "".join(d.get("content", "") for d in deltas[1:]) == "Let me check. "
    [streamed] = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert streamed["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_load_tracker_counts_model_requests_until_they_end():
    """--enable-server-load-tracking's middleware: a model-API request counts from its
    arrival until the app returns (a stream: after its last chunk), also when the app
    fails; other paths are not counted."""
    from vllm.entrypoints.openai.request_guards import LoadCounter, LoadTracker

    async def run():
        gate, counter = asyncio.Event(), LoadCounter()

        async def app(scope, receive, send):
            await gate.wait()
            if scope["path"].endswith("/rerank"):
                raise RuntimeError("boom")

        tracker = LoadTracker(app, counter)
        scopes = [{"type": "http", "path": p, "root_path": r} for p, r in
                  [("/v1/completions", ""), ("/api/v1/chat/completions", "/api"),
                   ("/v2/rerank", ""), ("/health", ""), ("/v1/models", "")]]  # fmt: skip
        tasks = [asyncio.ensure_future(tracker(s, None, None)) for s in scopes]
        await asyncio.sleep(0)
        seen = counter.value
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return seen, counter.value, [type(r).__name__ for r in results]

    assert asyncio.run(run()) == (3, 0, ["NoneType", "NoneType", "RuntimeError", "NoneType",
                                         "NoneType"])  # fmt: skip


def test_constrained_reply_is_content_under_a_reasoning_parser(tokenizer):
    """A constraint holds the reply to its grammar from the first token, so a reasoning
    parser leaves it whole as content: a JSON reply stays content, a forced call a call."""
    r = _answer(tokenizer, ['{"a": ', "1}"], reasoning="deepseek_r1",
                response_format={"type": "json_object"})  # fmt: skip
    msg = r["choices"][0]["message"]
    assert (msg["reasoning"], msg["content"]) == (None, '{"a": 1}')
    named = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        out = _answer(tokenizer, ['{"city": ', '"Paris"}'], reasoning="deepseek_r1",
                      tools=TOOLS, tool_choice=named, stream=stream)  # fmt: skip
        if stream:
            assert not any("reasoning" in c["choices"][0]["delta"] for c in out)
        else:
            [call] = out["choices"][0]["message"]["tool_calls"]
            assert call["function"]["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("reasoning", ["qwen3", "deepseek_r1"])
def test_gated_constrained_reply_splits_at_the_end_tag(tokenizer, reasoning):
    """A constraint that waits for the reasoning's end tag (the server's tag ids; the
    prompt leaves the reasoning open) is split where the grammar starts, at ``</think>``,
    whatever the parser does with a reply that has no opening tag: qwen3 put the free
    reasoning, the tag and the JSON all in ``content``."""
    pieces = ["Need a ", "pet.", "</think>", '{"a": ', "1}"]
    fmt = {"type": "json_object"}
    msg = _answer(tokenizer, pieces, reasoning=reasoning, tags=(49152, 49153),
                  response_format=fmt)["choices"][0]["message"]  # fmt: skip
    assert (msg["reasoning"], msg["content"]) == ("Need a pet.", '{"a": 1}')
    chunks = _answer(tokenizer, pieces, reasoning=reasoning, tags=(49152, 49153),
                     response_format=fmt, stream=True)  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning") or "" for d in deltas) == "Need a pet."
    assert "".join(d.get("content") or "" for d in deltas) == '{"a": 1}'


def test_named_call_cut_short_is_a_call_streamed_or_not(tokenizer):
    """A named function's reply cut before its JSON closes (max_tokens) is still the call,
    its arguments as generated, in both modes (upstream's behaviour)."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    pieces = ['{"city": ', '"Par']
    whole = _answer(tokenizer, pieces, tools=TOOLS, tool_choice=named)
    [call] = whole["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Par'
    assert whole["choices"][0]["message"]["content"] is None
    chunks = _answer(tokenizer, pieces, tools=TOOLS, tool_choice=named, stream=True)
    args = "".join(tc["function"].get("arguments", "") for c in chunks
                   for tc in c["choices"][0]["delta"].get("tool_calls", []))  # fmt: skip
    assert args == call["function"]["arguments"]


def test_mistral_parser_keeps_special_tokens(tokenizer):
    """The mistral format's [TOOL_CALLS] is a special token: with its parser the request is
    detokenized keeping special tokens, and the calls after it are parsed."""
    pieces = ["Sure.", "[TOOL_CALLS]", '[{"name": "get_weather", ',
              '"arguments": {"city": "Paris"}}]']  # fmt: skip
    for name, keeps in (("mistral", True), ("hermes", False)):
        engine = _Engine(tokenizer, pieces)
        handler = OpenAIServingChat(engine, ["m"], chat_template=TEMPLATE,
                                    tool_parser=get_tool_parser(name))  # fmt: skip
        req = ChatCompletionRequest(messages=MSGS, max_tokens=8, tools=TOOLS)
        asyncio.run(handler.create_chat_completion(req, None))
        assert engine.params.skip_special_tokens is not keeps
    engine = _Engine(tokenizer, pieces)
    handler = OpenAIServingChat(engine, ["m"], chat_template=TEMPLATE,
                                tool_parser=get_tool_parser("mistral"))  # fmt: skip
    req = ChatCompletionRequest(messages=MSGS, max_tokens=8, tools=TOOLS)
    msg = asyncio.run(handler.create_chat_completion(req, None)).model_dump()["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] == "Sure."
    [call] = msg["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_add_special_tokens(tokenizer):
    """Chat prompts get the tokenizer's special tokens only with add_special_tokens (the
    template writes its own); completion texts get them unless it is false (upstream's
    defaults)."""
    from vllm.entrypoints.openai.protocol import CompletionRequest
    from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion

    bos = _BosTokenizer(tokenizer)
    text = "<user>Weather in Paris?"
    plain = tokenizer.encode(text, add_special_tokens=False)
    for extra, want in (({}, plain), ({"add_special_tokens": True}, [bos.BOS_ID, *plain])):
        engine = _Engine(bos, ["ok"])
        _answer(bos, ["ok"], engine=engine, chat_template=TEMPLATE, add_generation_prompt=False,
                **extra)  # fmt: skip
        assert engine.prompt["prompt_token_ids"] == want, extra

    for extra, first in (({}, [bos.BOS_ID]), ({"add_special_tokens": False}, [])):
        engine = _Engine(bos, ["ok"])
        handler = OpenAIServingCompletion(engine, ["m"])
        req = CompletionRequest(model="m", prompt=text, max_tokens=2, **extra)
        asyncio.run(handler.create_completion(req, None))
        assert engine.prompt["prompt_token_ids"] == first + plain, extra


def test_return_token_ids_while_a_parser_holds_tokens(tokenizer):
    """Streamed with the hermes parser, the tokens of the held tool-call text reach the
    client with the chunk that follows them: the chunks' ids join to every generated id,
    and the first chunk carries the prompt's ids."""
    hermes = get_tool_parser("hermes")
    engine = _Engine(tokenizer, HERMES)
    chunks = _answer(tokenizer, HERMES, hermes, engine=engine, tools=TOOLS, stream=True,
                     return_token_ids=True)  # fmt: skip
    assert chunks[0]["prompt_token_ids"] == engine.prompt["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
    assert ids == list(range(len(HERMES)))  # the stub's token ids
    assert len(chunks) == 5  # role, three content chunks, the call: none added for the ids
    whole = _answer(tokenizer, HERMES, hermes, tools=TOOLS, return_token_ids=True)
    assert whole["choices"][0]["token_ids"] == list(range(len(HERMES)))


def test_tokenize_add_special_tokens(tokenizer):
    """/tokenize: a prompt gets the tokenizer's special tokens unless add_special_tokens
    is false; rendered messages only when it is true (upstream's defaults)."""
    from vllm.entrypoints.openai.serving_tokenization import (
        OpenAIServingTokenization,
        TokenizeRequest,
    )

    bos = _BosTokenizer(tokenizer)
    chat = OpenAIServingChat(_Engine(bos, ["ok"]), ["m"], chat_template=TEMPLATE)
    tok = OpenAIServingTokenization(chat)

    def ids(**body):
        return asyncio.run(tok.tokenize(TokenizeRequest(model="m", **body))).tokens

    plain = tokenizer.encode("hi", add_special_tokens=False)
    assert ids(prompt="hi") == [bos.BOS_ID, *plain]
    assert ids(prompt="hi", add_special_tokens=False) == plain
    rendered = tokenizer.encode("<user>hi", add_special_tokens=False)
    msgs = [{"role": "user", "content": "hi"}]
    assert ids(messages=msgs, add_generation_prompt=False) == rendered
    assert ids(messages=msgs, add_generation_prompt=False, add_special_tokens=True) == [
        bos.BOS_ID, *rendered
    ]  # fmt: skip


def test_top_logprobs_errors_name_top_logprobs(tokenizer):
    """Chat calls the per-token logprobs count top_logprobs: its errors say so, in the
    param and in the message (the engine's messages say logprobs)."""
    from vllm.entrypoints.openai.serving_engine import renamed_logprobs

    with pytest.raises(APIError) as err:
        _answer(tokenizer, ["x"], logprobs=True, top_logprobs=-2)
    assert err.value.param == "top_logprobs"
    assert err.value.message.startswith("top_logprobs must be >= 0"), err.value.message
    msg = "logprobs=-1 asks for the full vocabulary (49152), more than max_logprobs=20"
    assert renamed_logprobs(msg, "top_logprobs") == "top_" + msg
    assert (
        renamed_logprobs("prompt_logprobs=5 is more", "top_logprobs") == "prompt_logprobs=5 is more"
    )


def test_top_logprobs_zero_without_logprobs_is_accepted(tokenizer):
    """top_logprobs=0 with logprobs false (or left out) is accepted and returns no
    logprobs, as upstream (guards: every request with the field refused with a 400);
    a positive count without logprobs=true is still refused."""
    engine = _Engine(tokenizer, ["Par", "is"])
    for extra in ({"logprobs": False}, {}):
        out = _answer(tokenizer, None, engine=engine, top_logprobs=0, **extra)
        assert out["choices"][0]["message"]["content"] == "Paris"
        assert out["choices"][0]["logprobs"] is None
        assert engine.params.logprobs is None
    with pytest.raises(APIError) as err:
        _answer(tokenizer, ["x"], logprobs=False, top_logprobs=1)
    assert err.value.param == "top_logprobs" and "needs logprobs=true" in err.value.message


def test_best_of_other_than_one_or_n_is_refused(tokenizer):
    """Chat refuses best_of other than 1 or n with a 400 naming it, as completions do
    (guards: best_of=3 ignored, one sample returned as if it were the best of three)."""
    with pytest.raises(APIError) as err:
        _answer(tokenizer, ["x"], best_of=3)
    assert err.value.param == "best_of"
    assert err.value.message.startswith("best_of=3 is not supported"), err.value.message
    for best_of, n in ((1, 1), (2, 2)):
        out = _answer(tokenizer, ["Par", "is"], best_of=best_of, n=n)
        assert out["choices"][0]["message"]["content"] == "Paris"


DOC_TEMPLATE = (
    "{% for d in documents or [] %}[{{d['title']}}: {{d['text']}}]{% endfor %}"
    "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
)


def test_documents_reach_the_chat_template(tokenizer):
    """Regression: the request's ``documents`` were ignored as an unknown field, so a
    retrieval template rendered without them."""
    engine = _Engine(tokenizer, ["x"])
    docs = [{"title": "Paris", "text": "Sunny all week."}, {"title": "Rome", "text": "Rain."}]
    _answer(tokenizer, ["x"], engine=engine, chat_template=DOC_TEMPLATE, documents=docs)
    assert engine.prompt["prompt"] == (
        "[Paris: Sunny all week.][Rome: Rain.]<user>Weather in Paris?"
    )
    # chat_template_kwargs' documents win, as upstream
    kwargs = {"documents": [{"title": "Oslo", "text": "Snow."}]}
    _answer(tokenizer, ["x"], engine=engine, chat_template=DOC_TEMPLATE, documents=docs,
            chat_template_kwargs=kwargs)  # fmt: skip
    assert engine.prompt["prompt"] == "[Oslo: Snow.]<user>Weather in Paris?"
    _answer(tokenizer, ["x"], engine=engine, chat_template=DOC_TEMPLATE)
    assert engine.prompt["prompt"] == "<user>Weather in Paris?"


@pytest.mark.parametrize(
    "body, field, text",
    [
        ({"max_completion_tokens": -1}, "max_completion_tokens",
         "max_completion_tokens must be at least 1, got -1."),
        ({"max_completion_tokens": 0, "max_tokens": None}, "max_completion_tokens",
         "max_completion_tokens must be at least 1, got 0."),
        ({"max_tokens": -1}, "max_tokens", "max_tokens must be at least 1, got -1."),
        ({"max_completion_tokens": 10_000}, "max_completion_tokens",
         "or the completion (max_completion_tokens)."),
        ({"max_tokens": 10_000}, "max_tokens", "or the completion (max_tokens)."),
    ],
)  # fmt: skip
def test_token_limit_errors_name_the_field_sent(tokenizer, body, field, text):
    """Regression: a bad max_completion_tokens was reported as max_tokens, a field the
    client never sent."""
    with pytest.raises(APIError) as exc:
        _answer(tokenizer, ["x"], **body)
    assert (exc.value.code, exc.value.param) == (400, field)
    assert exc.value.message.endswith(text), exc.value.message


class _ParsingEngine(_Engine):
    """An engine whose grammar check parses the constraint as the real one does."""

    async def prepare_grammar(self, params):
        from vllm.model_executor.guided_decoding import compiler

        compiler.parse_grammar(params.guided_decoding)


@pytest.mark.parametrize(
    "grammar, lark", [('?start: "yes" | "no"', True), ('start ::= "yes"', False)]
)
def test_grammar_errors_say_which_syntax_is_read(tokenizer, grammar, lark):
    """Regression: a Lark guided_grammar got xgrammar's bare lexer error; the 400 says the
    grammar must be EBNF / GBNF with a root rule, and that Lark is not accepted."""
    pytest.importorskip("xgrammar")
    engine = _ParsingEngine(tokenizer, ["x"])
    with pytest.raises(APIError) as exc:
        _answer(tokenizer, ["x"], engine=engine, guided_grammar=grammar)
    msg = exc.value.message
    assert exc.value.code == 400 and msg.startswith("invalid guided grammar: EBNF")
    assert "must be EBNF / GBNF as xgrammar reads it" in msg and "root ::=" in msg
    assert ("Lark grammar, which is not accepted" in msg) is lark
    assert engine.request_ids == []


TWO_CALLS = [*HERMES, " <tool_call>", '{"name": "get_time", "arguments": {}}', "</tool_call>"]


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_keeps_one_call(tokenizer, parallel):
    """Regression: parallel_tool_calls was ignored; false keeps only a choice's first call,
    streamed and not (tool_choice "auto" and "required")."""
    hermes = get_tool_parser("hermes")
    want = ["get_weather", "get_time"] if parallel else ["get_weather"]
    body = dict(tools=TOOLS, parallel_tool_calls=parallel)
    whole = _answer(tokenizer, TWO_CALLS, hermes, **body)["choices"][0]
    assert [c["function"]["name"] for c in whole["message"]["tool_calls"]] == want
    assert whole["finish_reason"] == "tool_calls"
    chunks = _answer(tokenizer, TWO_CALLS, hermes, stream=True, **body)
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls] == want
    assert [c["index"] for c in calls] == list(range(len(want)))
    pieces = ['[{"name": "get_weather", "parameters": {}}, ',
              '{"name": "get_time", "parameters": {}}]']  # fmt: skip
    for stream in (False, True):
        out = _answer(tokenizer, pieces, tool_choice="required", stream=stream, **body)
        if stream:
            calls = [tc for c in out for tc in c["choices"][0]["delta"].get("tool_calls", [])]
        else:
            calls = out["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"][: len(want)]


VARS_TEMPLATE = (
    "{% if tools %}TOOLS={{tools|length}};{% endif %}{% if foo is defined %}FOO={{foo}};"
    "{% endif %}{% if bar is defined %}BAR={{bar}};{% endif %}"
    "{% for m in messages %}<{{m['role']}}>{{m['content']}}{% endfor %}"
)


def _rendered(tokenizer, handler_kwargs: dict, **body) -> str:
    """The prompt text a handler built with ``handler_kwargs`` sends for ``body``."""
    engine = _Engine(tokenizer, ["x"])
    handler = OpenAIServingChat(engine, ["m"], chat_template=VARS_TEMPLATE, **handler_kwargs)
    req = ChatCompletionRequest(**{"messages": MSGS, "max_tokens": 4, **body})
    asyncio.run(handler.create_chat_completion(req, None))
    return engine.prompt["prompt"]


def test_exclude_tools_when_tool_choice_none(tokenizer):
    """exclude_tools_when_tool_choice_none (``--exclude-tools-when-tool-choice-none``):
    a request with tool_choice "none" renders without tools; other choices keep them."""
    on = {"exclude_tools_when_tool_choice_none": True}
    assert _rendered(tokenizer, on, tools=TOOLS, tool_choice="none") == ("<user>Weather in Paris?")
    assert _rendered(tokenizer, {}, tools=TOOLS, tool_choice="none").startswith("TOOLS=1;")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert _rendered(tokenizer, on, tools=TOOLS, tool_choice=named).startswith("TOOLS=1;")


def test_default_chat_template_kwargs_under_the_requests(tokenizer):
    """default_chat_template_kwargs (``--default-chat-template-kwargs``) reach every
    request's template; a request's chat_template_kwargs win key by key."""
    defaults = {"default_chat_template_kwargs": {"foo": "d", "bar": 1}}
    assert _rendered(tokenizer, defaults) == "FOO=d;BAR=1;<user>Weather in Paris?"
    assert _rendered(tokenizer, defaults, chat_template_kwargs={"foo": "r"}) == (
        "FOO=r;BAR=1;<user>Weather in Paris?"
    )
    assert _rendered(tokenizer, {}) == "<user>Weather in Paris?"
    for bad, match in (({"tools": []}, r"must not set \['tools'\]"), ([1], "JSON object")):
        with pytest.raises(ValueError, match=match):
            OpenAIServingChat(_Engine(tokenizer, []), ["m"], default_chat_template_kwargs=bad)
