"""/v1/chat/completions: the conversation is rendered to prompt text with a chat template
(the request's ``chat_template``, else the server's ``--chat-template``, else the
tokenizer's own; none of them -> 400) and tokenized without added special tokens; the
engine gets both, so the request log shows the text. Streaming or not. max_tokens (or
max_completion_tokens) absent or null -> the rest of the context; the generation config's
max_new_tokens caps it. ``truncate_prompt_tokens=k`` keeps the rendered prompt's last k
tokens (-1: the last max_model_len), as on /v1/completions. Structured outputs
(structured_outputs, response_format, guided_*) as guided_request.py; tools and
tool_choice as tool_calls.py.

The messages, ``tools``, ``documents`` and ``chat_template_kwargs`` reach the template as
chat_utils.py describes (with ``--exclude-tools-when-tool-choice-none``, no ``tools`` when
tool_choice is "none"; ``--default-chat-template-kwargs`` under the request's own). The
reply's role is "assistant", or with ``add_generation_prompt`` false the last message's
role; ``continue_final_message`` (which needs ``add_generation_prompt`` false) ends the
prompt inside that message, and ``echo`` starts the reply's content with the last
message's content when that message has the reply's role. Streamed chunks follow OpenAI's
shape: the first delta of a choice is ``{"role": ..., "content": ""}``, later deltas hold
only the fields they set (one per token for text), and a token whose text a
tool-call mode holds back sends no chunk."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from vllm.entrypoints.chat_utils import (
    ChatInputError,
    check_chat_options,
    check_default_template_kwargs,
    has_chat_template,
    message_text,
    render_chat,
    resolve_content_format,
    template_messages,
)
from vllm.entrypoints.openai.api_errors import APIError, to_api_error
from vllm.entrypoints.openai.completion_logprobs import (
    MIN_LOGPROB,
    json_logprob,
    prompt_logprobs,
    top_k,
)
from vllm.entrypoints.openai.guided_request import guided_field, guided_params
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
from vllm.entrypoints.openai.request_streams import collect_final
from vllm.entrypoints.openai.serving_engine import OpenAIServing, base_request_id
from vllm.entrypoints.openai.sse_template import TextChunks
from vllm.entrypoints.openai.tool_calls import (
    ToolCallStream,
    ToolMode,
    parse_tool_calls,
    tool_mode,
)
from vllm.entrypoints.openai.tool_parsers import ToolParser
from vllm.reasoning import ReasoningParser
from vllm.sequence import PositionLogprobs


class OpenAIServingChat(OpenAIServing):
    """Handler of /v1/chat/completions.

    Args:
        chat_template: the server's template text (``--chat-template``, already loaded by
            :func:`~vllm.entrypoints.chat_utils.load_chat_template`); None: the tokenizer's.
        tool_parser: the parser of tool_choice "auto" (``--tool-call-parser`` with
            ``--enable-auto-tool-choice``); None: "auto" with tools is refused.
        content_format: ``--chat-template-content-format``: how message contents reach
            the template, ``auto`` (detected per template), ``string`` or ``openai``
            (see vllm/entrypoints/chat_utils.py).
        reasoning_parser: ``--reasoning-parser``: splits each reply into ``reasoning``
            and ``content`` (vllm/reasoning); tool calls are parsed from the content.
        exclude_tools_when_tool_choice_none: ``--exclude-tools-when-tool-choice-none``: a
            request whose tool_choice is "none" renders its template without ``tools``.
        default_chat_template_kwargs: ``--default-chat-template-kwargs``: template
            variables every request gets; a request's ``chat_template_kwargs`` override
            them key by key.
        trust_request_chat_template: ``--trust-request-chat-template``: render with a
            ``chat_template`` sent in the request (or in its ``chat_template_kwargs``);
            off (upstream's default), such a request gets a 400 naming the flag.
        Others: as :class:`OpenAIServing`.

    Raises:
        ValueError: ``default_chat_template_kwargs`` is not a dict, or sets an argument of
            its own (``tools``, ``add_generation_prompt``, ...).
    """

    def __init__(
        self,
        *args,
        chat_template: str | None = None,
        tool_parser: ToolParser | None = None,
        response_role: str = "assistant",
        content_format: str = "auto",
        reasoning_parser: ReasoningParser | None = None,
        exclude_tools_when_tool_choice_none: bool = False,
        default_chat_template_kwargs: dict[str, Any] | None = None,
        trust_request_chat_template: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.trust_request_chat_template = trust_request_chat_template
        self.default_chat_template_kwargs = check_default_template_kwargs(
            default_chat_template_kwargs
        )
        self.exclude_tools_when_tool_choice_none = exclude_tools_when_tool_choice_none
        self.reasoning_parser = reasoning_parser
        self.content_format = content_format
        self.chat_template = chat_template
        self.tool_parser = tool_parser
        self.response_role = response_role  # --response-role: the reply's role

    async def message_ids(
        self, req, add_special_tokens: bool = False, bounded: bool = True, **extra
    ) -> list[int]:
        """Token ids of another API's chat-style ``messages`` (/tokenize, /v1/embeddings,
        /pooling), rendered as this endpoint renders them: ``req``'s model, messages,
        add_generation_prompt, continue_final_message, chat_template and
        chat_template_kwargs, plus ``extra`` ChatCompletionRequest fields (tools,
        truncate_prompt_tokens). ``bounded=False`` (/tokenize) tokenizes messages however
        long, without the context-length refusal. Raises what :meth:`_prompt` raises."""
        as_chat = ChatCompletionRequest(
            model=req.model,
            messages=req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            **extra,
        )
        return (await self._prompt(as_chat, add_special_tokens, bounded))[1]

    def check_request_template(self, req: ChatCompletionRequest) -> None:
        """Refuse a template sent with the request unless the server trusts them.

        Raises:
            APIError 400: ``chat_template`` (or ``chat_template_kwargs["chat_template"]``)
                is set and ``--trust-request-chat-template`` is off.
        """
        if self.trust_request_chat_template:
            return
        if req.chat_template is not None:
            field, what = "chat_template", "chat_template"
        elif (req.chat_template_kwargs or {}).get("chat_template") is not None:
            field, what = "chat_template_kwargs", "chat_template_kwargs.chat_template"
        else:
            return
        raise APIError(
            f"the request sets {what}, but this server renders chats only with its own "
            "template (--chat-template or the tokenizer's); start it with "
            "--trust-request-chat-template to accept templates from requests.",
            400,
            field,
        )

    async def _prompt(
        self, req: ChatCompletionRequest, add_special_tokens: bool = False, bounded: bool = True
    ) -> tuple[str | None, list[int], list[dict]]:
        """Check the messages, then render and tokenize them on the tokenizer thread; with
        ``truncate_prompt_tokens=k`` only the rendered prompt's last k tokens are kept, and
        with ``truncate_prompt_tokens`` or ``bounded=False`` a text longer than the context
        can hold is tokenized rather than refused (see ``check_text``). The
        template writes the special tokens itself; ``add_special_tokens`` adds the
        tokenizer's (a BOS ...) on top, as upstream's field of that name.

        Returns:
            (prompt text, None when truncation cut it; prompt token ids; the messages as the
            template saw them).
        Raises:
            APIError 400: no messages, no tokenizer, no chat template, a message or option
                that cannot be rendered, a template error, a bad truncate_prompt_tokens.
        """
        keep = self.kept_tokens(req)
        if not req.messages:
            raise APIError("messages must not be empty (got an empty list).", 400, "messages")
        if self.tokenizer is None:
            raise APIError("chat needs a tokenizer (skip_tokenizer_init is set).", 400)
        self.check_request_template(req)
        template = req.chat_template or self.chat_template
        if not has_chat_template(self.tokenizer, template):
            raise APIError(
                f"The model `{self.model_name}` has no chat template, so chat requests "
                "cannot be served: start the server with --chat-template (a file or an "
                "inline Jinja string), send chat_template in the request (to a server started "
                "with --trust-request-chat-template), or use /v1/completions.",
                400,
                "messages",
            )
        try:
            check_chat_options(
                req.add_generation_prompt, req.continue_final_message, req.chat_template_kwargs
            )
            fmt = resolve_content_format(self.content_format, template, self.tokenizer)
            messages = [m.model_dump(exclude_none=True) for m in req.messages]
            conv = template_messages(messages, fmt)
        except ChatInputError as e:
            raise APIError(str(e), 400, e.param) from None
        texts = [message_text(m) for m in conv]
        bounded = bounded and keep is None
        for i, text in enumerate(texts):
            self.check_text(text, f"messages[{i}].content", bounded=bounded)
        self.check_text("".join(texts), "messages", bounded=bounded)
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        if self.exclude_tools_when_tool_choice_none and req.tool_choice == "none":
            tools = []
        kwargs = {**self.default_chat_template_kwargs, **(req.chat_template_kwargs or {})}
        try:
            text = await self.off_loop(
                render_chat,
                self.tokenizer,
                conv,
                template,
                req.add_generation_prompt,
                req.continue_final_message,
                tools,
                kwargs,
                self.content_format,
                req.documents,
            )
        except Exception as e:  # jinja errors and content-format mismatches are the request's
            raise APIError(f"could not apply the chat template: {e}", 400, "messages") from e
        ids = await self.off_loop(self._encode_rendered, text, add_special_tokens)
        if keep is not None and len(ids) > keep:
            return None, ids[-keep:], conv
        return text, ids, conv

    def _encode_rendered(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def create_chat_completion(
        self, req: ChatCompletionRequest, raw: Request | None, id_prefix: str = "chatcmpl-"
    ):
        """Returns a ChatCompletionResponse, or an async iterator of SSE strings. The
        response id, which is also the engine's request id (logs, aborts), is
        ``id_prefix`` + the request's id (``resp_`` for the Responses API).

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        self.check_model(req.model)
        self.check_generative("Chat Completions")
        max_tokens, field = req.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens, field = req.max_tokens, "max_tokens"
        self.check_max_tokens(max_tokens, field=field)
        self.check_best_of(req)
        text, ids, conv = await self._prompt(req, req.add_special_tokens)
        budget = self.check_length(len(ids), max_tokens, "messages", field)
        k = None
        # top_logprobs=0 asks for nothing beyond the chosen token, so it needs no logprobs
        # (as upstream: clients that always send the field get no 400)
        if req.top_logprobs not in (None, 0) and not req.logprobs:
            raise APIError(
                f"top_logprobs={req.top_logprobs} needs logprobs=true.", 400, "top_logprobs"
            )
        if req.logprobs:
            k = req.top_logprobs or 0
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(
                "prompt_logprobs are not available when stream is true.", 400, "prompt_logprobs"
            )
        mode, guided = tool_mode(req, self.tool_parser)
        param = "tools"
        if guided is None:
            guided, param = guided_params(req), guided_field(req)
        if req.use_beam_search:  # n beams, each step a request of its own
            if mode.active:
                raise APIError("tool calls are not supported with use_beam_search.", 400, "tools")
            params = self.beam_params(req, budget)
            self.check_schedulable(len(ids), 1, True)
        else:
            params = self.sampling_params(req, budget, k, req.prompt_logprobs, guided,
                                          logprobs_field="top_logprobs")  # fmt: skip
            if mode.parser is not None and mode.parser.keeps_special_tokens:
                params.skip_special_tokens = False  # its markers are special tokens
            self.check_params(params, "top_logprobs")
            self.check_schedulable(len(ids), req.n, req.prompt_logprobs is None,
                                   max_tokens=params.max_tokens)  # fmt: skip
            await self.check_guided(params, param)
        rid = f"{id_prefix}{base_request_id(raw, req.request_id)}"
        gen = self.start(req, {"prompt": text, "prompt_token_ids": ids}, params, rid)
        created = int(time.time())
        role = self.response_role if req.add_generation_prompt else conv[-1]["role"]
        echo = message_text(conv[-1]) if req.echo and conv[-1]["role"] == role else ""
        as_id = req.return_tokens_as_token_ids  # None: the server's flag
        # A constrained reply (guided decoding, a forced tool call) is split only when its
        # grammar waits for the reasoning to end; one held to its grammar from the first
        # token (enable_in_reasoning, no tag ids, a prompt that closed the reasoning) has
        # no reasoning to split off: all of it is content.
        gd = getattr(params, "guided_decoding", None)
        splitter = self.reasoning_parser
        if gd is not None and splitter is not None:
            # the split follows the grammar's gate: reasoning until the end tag
            splitter = None if gd.reasoning_ended(ids) else splitter.until_end_tag()
        if req.stream:
            return self._stream(req, gen, rid, created, ids, mode, role, echo, as_id, splitter)
        final = await collect_final(gen, raw)
        if final is None:
            return None
        choices, completion_tokens = [], 0
        for o in final.outputs:
            completion_tokens += o.num_generated_tokens()
            lps = None
            if req.logprobs:
                lps = self._logprobs(o.token_ids, o.logprobs or [], k, as_id)
            reasoning, text = None, o.text
            if splitter is not None:
                reasoning, text = splitter.extract(o.text)
                reasoning = reasoning if req.include_reasoning else None
            calls, content = parse_tool_calls(mode, text or "") if mode.active else (None, text)
            if echo:
                content = echo + (content or "")
            if splitter is not None and not content:
                content = None  # all reasoning (or nothing): no content, as upstream
            message = ResponseMessage(
                role=role, content=content, reasoning=reasoning, tool_calls=calls or []
            )
            finish = mode.finish_reason(o.finish_reason, calls is not None)
            choices.append(
                ChatCompletionResponseChoice(
                    index=o.index,
                    message=message,
                    logprobs=lps,
                    finish_reason=finish,
                    stop_reason=o.stop_reason,
                    token_ids=list(o.token_ids) if req.return_token_ids else None,
                )
            )
        usage = self.usage(len(ids), completion_tokens, final.num_cached_tokens)
        plps = None
        if req.prompt_logprobs is not None:
            plps = prompt_logprobs(
                ids,
                final.prompt_logprobs,
                req.prompt_logprobs,
                lambda t, lp=None: self.token_text(t, as_id, lp),
            )
        return ChatCompletionResponse(
            id=rid,
            created=created,
            model=self.model_for(req),
            choices=choices,
            usage=usage,
            prompt_logprobs=plps,
            prompt_token_ids=list(ids) if req.return_token_ids else None,
        )

    async def _stream(
        self,
        req,
        gen,
        rid,
        created,
        prompt_ids: list[int],
        mode: ToolMode,
        role: str,
        echo: str,
        as_id,
        splitter: ReasoningParser | None,
    ) -> AsyncIterator[str]:
        """A role chunk per choice (then the echoed content, if any), then a chunk per
        generated token that adds something (tool-call deltas instead of content when
        tool_choice is not "none", see tool_calls.py); each choice's last chunk, the one
        with its finish_reason, is sent once, although the engine repeats a finished
        choice on every step until its siblings end. With ``stream_options``
        ``include_usage`` a last chunk has the usage; with ``continuous_usage_stats`` as
        well, every chunk carries its choice's usage so far. With ``return_token_ids`` the
        first chunk has ``prompt_token_ids`` and every later chunk the ids generated since
        its choice's previous chunk (tokens whose text a tool or reasoning mode holds back
        go out with the next chunk)."""
        n = req.n
        prompt_len = len(prompt_ids)
        with_ids = bool(req.return_token_ids)
        unsent_ids: list[list[int]] = [[] for _ in range(n)]
        opts = req.stream_options
        include_usage = self.force_include_usage or (opts is not None and bool(opts.include_usage))
        continuous = include_usage and opts is not None and bool(opts.continuous_usage_stats)
        sent_tokens, sent_chars = [0] * n, [0] * n
        generated = [0] * n  # tokens generated per choice, see OpenAIServing.usage
        finished = [False] * n  # the choice's final chunk went out (later outputs repeat it)
        tools = [ToolCallStream(mode) for _ in range(n)] if mode.active else None
        splits = [splitter.stream() for _ in range(n)] if splitter is not None else None
        plain = TextChunks(  # the usual chunk: content only (no logprobs, finish or tools)
            lambda index, text: ChatCompletionStreamResponse(
                id=rid,
                created=created,
                model=self.model_for(req),
                choices=[ChatCompletionStreamChoice(index=index, delta=DeltaMessage(content=text))],
            )  # fmt: skip
        )

        cached = 0  # prompt tokens read from the prefix cache (set by the first output)

        def usage_so_far(index: int | None = None) -> UsageInfo:
            """Every choice's usage, or choice ``index``'s (continuous chunks, as upstream)."""
            done = sum(generated) if index is None else generated[index]
            return self.usage(prompt_len, done, cached)

        def chunk(choices, usage=None, prompt_token_ids=None) -> str:
            if usage is None and continuous:
                usage = usage_so_far(choices[0].index if choices else None)
            resp = ChatCompletionStreamResponse(
                id=rid, created=created, model=self.model_for(req), choices=choices, usage=usage,
                prompt_token_ids=prompt_token_ids,
            )  # fmt: skip
            return f"data: {resp.model_dump_json()}\n\n"

        def chunk_text(index: int, text: str) -> str:
            """A content-only chunk: the cached template's, unless it must carry usage."""
            if continuous:
                delta = DeltaMessage(content=text)
                return chunk([ChatCompletionStreamChoice(index=index, delta=delta)])
            return plain.format(index, text)

        try:
            for i in range(n):
                first = DeltaMessage(role=role, content="")
                prompt = list(prompt_ids) if with_ids and i == 0 else None
                yield chunk([ChatCompletionStreamChoice(index=i, delta=first)], None, prompt)
                if echo:
                    yield chunk_text(i, echo)
            async for out in gen:
                cached = out.num_cached_tokens
                for o in out.outputs:
                    i = o.index
                    generated[i] = o.num_generated_tokens()
                    new_ids = list(o.token_ids[sent_tokens[i] :])
                    if finished[i] or (not new_ids and not o.finish_reason):
                        continue
                    finished[i] = o.finish_reason is not None
                    lps = None
                    if req.logprobs and o.logprobs is not None:
                        lps = self._logprobs(
                            new_ids, o.logprobs[sent_tokens[i] :], req.top_logprobs or 0, as_id
                        )
                    delta = o.text[sent_chars[i] :]
                    unsent_ids[i] += new_ids
                    sent_tokens[i] += len(new_ids)
                    sent_chars[i] = max(sent_chars[i], len(o.text))
                    fields, finish = {"content": delta}, o.finish_reason
                    if splits is not None:  # reasoning first, then the content (or tools)
                        thought, delta = splits[i].delta(delta, finish is not None)
                        fields = {"content": delta} if delta else {}
                        if thought and req.include_reasoning:
                            fields = {"reasoning": thought, **fields}
                    if tools is not None:
                        fields = {k: v for k, v in fields.items() if k == "reasoning"}
                        fields.update(tools[i].delta(delta, finish is not None))
                        finish = mode.finish_reason(finish, "tool_calls" in fields)
                    if tools is not None or splits is not None:
                        if not fields and finish is None and lps is None:
                            continue
                    elif lps is None and finish is None and o.stop_reason is None and not with_ids:
                        yield chunk_text(i, delta)
                        continue
                    yield chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i,
                                delta=DeltaMessage(**fields),
                                logprobs=lps,
                                finish_reason=finish,
                                stop_reason=o.stop_reason,
                                token_ids=unsent_ids[i] if with_ids else None,
                            )
                        ]
                    )
                    unsent_ids[i] = []
            if include_usage:
                yield chunk([], usage_so_far())
        except Exception as e:
            yield to_api_error(e).sse()
        finally:
            await gen.aclose()
        yield "data: [DONE]\n\n"

    def _logprobs(
        self, token_ids, positions: list[PositionLogprobs], k: int, as_id: bool | None = None
    ) -> ChatLogProbs:
        """OpenAI chat logprobs of ``token_ids``: each token's logprob and its top ``k``
        (every token for k = -1; tokens named by :meth:`token_text` with ``as_id``)."""
        content = []
        for tid, pos in zip(token_ids, positions):
            chosen = pos.get(tid)
            tok = self.token_text(tid, as_id, chosen)
            ranked = top_k(sorted(pos.items(), key=lambda kv: -kv[1].logprob), k)
            content.append(
                ChatLogProbsContent(
                    token=tok,
                    logprob=json_logprob(chosen.logprob) if chosen is not None else MIN_LOGPROB,
                    bytes=list(tok.encode()),
                    top_logprobs=[
                        ChatLogProb(
                            token=text, logprob=json_logprob(lp.logprob), bytes=list(text.encode())
                        )  # fmt: skip
                        for t, lp in ranked
                        for text in (self.token_text(t, as_id, lp),)
                    ],
                )
            )
        return ChatLogProbs(content=content)
