"""/v1/chat/completions: the tokenizer's chat template (``apply_chat_template`` with
``add_generation_prompt``), streaming or not. max_tokens (or max_completion_tokens) absent
or null -> the rest of the context."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

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
    """Handler of /v1/chat/completions."""

    async def _prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        """Check the messages, then apply the chat template on the tokenizer thread."""
        if not req.messages:
            raise APIError("messages must not be empty (got an empty list).", 400, "messages")
        if self.tokenizer is None:
            raise APIError("chat needs a tokenizer (skip_tokenizer_init is set).", 400)
        conv = [
            {"role": m.role, "content": _content_text(m.content, i)}
            for i, m in enumerate(req.messages)
        ]
        for i, m in enumerate(conv):
            self.check_text(m["content"], f"messages[{i}].content")
        self.check_text("".join(m["content"] for m in conv), "messages")
        try:
            ids = await self.off_loop(self._apply_template, conv, req)
        except Exception as e:  # jinja / template errors are the request's fault
            raise APIError(f"could not apply the chat template: {e}", 400, "messages") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def _apply_template(self, conv: list[dict], req: ChatCompletionRequest):
        return self.tokenizer.apply_chat_template(
            conv,
            chat_template=req.chat_template,
            add_generation_prompt=req.add_generation_prompt,
            tokenize=True,
        )

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
        ids = await self._prompt_ids(req)
        budget = self.check_length(len(ids), max_tokens, "messages")
        k = None
        if req.logprobs:
            k = req.top_logprobs or 0
        params = self.sampling_params(req, budget, k)
        self.check_schedulable(len(ids), req.n)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        gen = self.engine.generate({"prompt_token_ids": ids}, params, rid)
        created = int(time.time())
        if req.stream:
            return self._stream(req, gen, rid, created, len(ids))
        final = await collect_final(gen, raw)
        if final is None:
            return None
        choices, completion_tokens = [], 0
        for o in final.outputs:
            completion_tokens += len(o.token_ids)
            lps = None
            if req.logprobs:
                lps = self._logprobs(o.token_ids, o.logprobs or [], k)
            choices.append(
                ChatCompletionResponseChoice(
                    index=o.index,
                    message=ResponseMessage(content=o.text),
                    logprobs=lps,
                    finish_reason=o.finish_reason,
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

    async def _stream(self, req, gen, rid, created, prompt_len) -> AsyncIterator[str]:
        """A role chunk per choice, then one chunk per generated token."""
        n = req.n
        sent_tokens, sent_chars = [0] * n, [0] * n
        completion_tokens = 0

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
                    yield chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i,
                                delta=DeltaMessage(content=delta),
                                logprobs=lps,
                                finish_reason=o.finish_reason,
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
