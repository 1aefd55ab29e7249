"""/v1/chat/completions: the conversation is rendered to prompt text with a chat template
(the request's ``chat_template``, else the server's ``--chat-template``, else the
tokenizer's own; none of them -> 400) and tokenized without added special tokens; the
engine gets both, so the request log shows the text. Streaming or not. max_tokens (or
max_completion_tokens) absent or null -> the rest of the context. Structured outputs
(response_format, guided_*) as guided_request.py; tools and tool_choice as tool_calls.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from vllm.entrypoints.chat_utils import has_chat_template, render_chat
from vllm.entrypoints.openai.guided_request import guided_params
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    DeltaMessage,
    ResponseMessage,
    UsageInfo,
)
from vllm.entrypoints.openai.serving_engine import (
    APIError,
    OpenAIServing,
    collect_final,
    to_api_error,
)
from vllm.entrypoints.openai.sse_template import TextChunks
from vllm.entrypoints.openai.tool_calls import (
    ToolCallStream,
    ToolMode,
    parse_tool_calls,
    tool_mode,
)
from vllm.sequence import PositionLogprobs


def _content_text(content, i: int) -> str:
    """A message's text; a content part other than text is refused (this engine is
    text-only), never silently dropped.

    Raises:
        APIError 400: naming the part's type and where it is.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type", "text")
        if kind != "text":
            raise APIError(
                f"messages[{i}].content[{j}] has type {kind!r}: this model takes text only "
                "(content parts of type 'text').",
                400,
                f"messages.{i}.content.{j}.type",
            )
        texts.append(str(part.get("text", "")))
    return "".join(texts)


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions.

    Args:
        chat_template: the server's template text (``--chat-template``, already loaded by
            :func:`~vllm.entrypoints.chat_utils.load_chat_template`); None: the tokenizer's.
        Others: as :class:`OpenAIServing`.
    """

    def __init__(self, *args, chat_template: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.chat_template = chat_template

    async def _prompt(self, req: ChatCompletionRequest) -> tuple[str, list[int]]:
        """Check the messages, then render and tokenize them on the tokenizer thread.

        Returns:
            (prompt text, prompt token ids).
        Raises:
            APIError 400: no messages, no tokenizer, no chat template, a template error.
        """
        if not req.messages:
            raise APIError("messages must not be empty (got an empty list).", 400, "messages")
        if self.tokenizer is None:
            raise APIError("chat needs a tokenizer (skip_tokenizer_init is set).", 400)
        template = req.chat_template or self.chat_template
        if not has_chat_template(self.tokenizer, template):
            raise APIError(
                f"The model `{self.model_name}` has no chat template, so chat requests "
                "cannot be served: start the server with --chat-template (a file or an "
                "inline Jinja string), send chat_template in the request, or use "
                "/v1/completions.",
                400,
                "messages",
            )
        conv = [
            {"role": m.role, "content": _content_text(m.content, i)}
            for i, m in enumerate(req.messages)
        ]
        for i, m in enumerate(conv):
            self.check_text(m["content"], f"messages[{i}].content")
        self.check_text("".join(m["content"] for m in conv), "messages")
        try:
            text = await self.off_loop(
                render_chat, self.tokenizer, conv, template, req.add_generation_prompt
            )
        except Exception as e:  # jinja / template errors are the request's fault
            raise APIError(f"could not apply the chat template: {e}", 400, "messages") from e
        ids = await self.off_loop(self._encode_rendered, text)
        return text, ids

    def _encode_rendered(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request | None):
        """Returns a ChatCompletionResponse, or an async iterator of SSE strings.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        self.check_model(req.model)
        max_tokens = req.max_completion_tokens
        if max_tokens is None:
            max_tokens = req.max_tokens
        self.check_max_tokens(max_tokens)
        text, ids = await self._prompt(req)
        budget = self.check_length(len(ids), max_tokens, "messages")
        k = None
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(
                f"top_logprobs={req.top_logprobs} needs logprobs=true.", 400, "top_logprobs"
            )
        if req.logprobs:
            k = req.top_logprobs or 0
        mode, guided = tool_mode(req)
        param = "tools"
        if guided is None:
            guided, param = guided_params(req), "response_format"
        params = self.sampling_params(req, budget, k, guided=guided)
        self.check_params(params, "top_logprobs")
        self.check_schedulable(len(ids), req.n)
        await self.check_guided(params, param)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        gen = self.engine.generate({"prompt": text, "prompt_token_ids": ids}, params, rid)
        created = int(time.time())
        if req.stream:
            return self._stream(req, gen, rid, created, len(ids), mode)
        final = await collect_final(gen, raw)
        if final is None:
            return None
        choices, completion_tokens = [], 0
        for o in final.outputs:
            completion_tokens += len(o.token_ids)
            lps = None
            if req.logprobs:
                lps = self._logprobs(o.token_ids, o.logprobs or [], k)
            message, finish = ResponseMessage(content=o.text), o.finish_reason
            calls = parse_tool_calls(mode, o.text) if mode.active else None
            if calls is not None:
                message = ResponseMessage(content=None, tool_calls=calls)
                finish = "tool_calls" if mode.required and finish == "stop" else finish
            choices.append(
                ChatCompletionResponseChoice(
                    index=o.index,
                    message=message,
                    logprobs=lps,
                    finish_reason=finish,
                    stop_reason=o.stop_reason,
                )
            )
        usage = UsageInfo(
            prompt_tokens=len(ids),
            completion_tokens=completion_tokens,
            total_tokens=len(ids) + completion_tokens,
        )
        return ChatCompletionResponse(
            id=rid, created=created, model=self.model_name, choices=choices, usage=usage
        )

    async def _stream(
        self, req, gen, rid, created, prompt_len, mode: ToolMode
    ) -> AsyncIterator[str]:
        """A role chunk per choice, then one chunk per generated token (tool-call deltas
        instead of content when tool_choice forces a call, see tool_calls.py)."""
        n = req.n
        sent_tokens, sent_chars = [0] * n, [0] * n
        tools = [ToolCallStream(mode) for _ in range(n)] if mode.active else None
        completion_tokens = 0
        plain = TextChunks(  # the usual chunk: content only (no logprobs, finish or tools)
            lambda index, text: ChatCompletionStreamResponse(
                id=rid,
                created=created,
                model=self.model_name,
                choices=[ChatCompletionStreamChoice(index=index, delta=DeltaMessage(content=text))],
            )  # fmt: skip
        )

        def chunk(choices, usage=None) -> str:
            resp = ChatCompletionStreamResponse(
                id=rid, created=created, model=self.model_name, choices=choices, usage=usage
            )
            return f"data: {resp.model_dump_json()}\n\n"

        try:
            for i in range(n):
                yield chunk(
                    [ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant"))]
                )
            async for out in gen:
                for o in out.outputs:
                    i = o.index
                    new_ids = list(o.token_ids[sent_tokens[i] :])
                    if not new_ids and not o.finish_reason:
                        continue
                    lps = None
                    if req.logprobs and o.logprobs is not None:
                        lps = self._logprobs(
                            new_ids, o.logprobs[sent_tokens[i] :], req.top_logprobs or 0
                        )
                    delta = o.text[sent_chars[i] :]
                    sent_tokens[i] += len(new_ids)
                    sent_chars[i] = max(sent_chars[i], len(o.text))
                    completion_tokens += len(new_ids)
                    fields, finish = {"content": delta}, o.finish_reason
                    if tools is not None:
                        fields = tools[i].delta(delta, finish is not None)
                        if mode.required and finish == "stop" and "tool_calls" in fields:
                            finish = "tool_calls"
                    elif lps is None and finish is None and o.stop_reason is None:
                        yield plain.format(i, delta)
                        continue
                    yield chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i,
                                delta=DeltaMessage(**fields),
                                logprobs=lps,
                                finish_reason=finish,
                                stop_reason=o.stop_reason,
                            )
                        ]
                    )
            if req.stream_options is not None and req.stream_options.include_usage:
                usage = UsageInfo(
                    prompt_tokens=prompt_len,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_len + completion_tokens,
                )
                yield chunk([], usage)
        except Exception as e:
            yield to_api_error(e).sse()
        finally:
            await gen.aclose()
        yield "data: [DONE]\n\n"

    def _logprobs(self, token_ids, positions: list[PositionLogprobs], k: int) -> ChatLogProbs:
        content = []
        for tid, pos in zip(token_ids, positions):
            tok = self.token_text(tid)
            chosen = pos.get(tid)
            ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)[:k]
            content.append(
                ChatLogProbsContent(
                    token=tok,
                    logprob=chosen.logprob if chosen is not None else float("-inf"),
                    bytes=list(tok.encode()),
                    top_logprobs=[
                        ChatLogProb(
                            token=self.token_text(t),
                            logprob=lp.logprob,
                            bytes=list(self.token_text(t).encode()),
                        )
                        for t, lp in ranked
                    ],
                )
            )
        return ChatLogProbs(content=content)
