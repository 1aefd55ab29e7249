"""/v1/completions: text or token-id prompts (one or a list), streaming or not.

max_tokens: absent -> 16, null -> the rest of the context (max_model_len - prompt),
0 only with echo (the prompt and its logprobs, no completion tokens: the engine runs one
token, which is dropped, so a prompt of the whole context fits); the generation config's
max_new_tokens caps it. Choice index = prompt index x n + sequence index.

``truncate_prompt_tokens=k`` keeps each prompt's last k tokens (-1: the last
max_model_len); the context check applies to what is kept. ``prompt_logprobs`` come back in
each choice of a non-streamed response (completion_logprobs.py); a streamed request with
them is a 400, as upstream. ``stream_options.continuous_usage_stats`` puts the usage so far
on every chunk. ``suffix`` is refused (no fill-in-the-middle).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request

from vllm.entrypoints.openai.api_errors import APIError, to_api_error
from vllm.entrypoints.openai.completion_logprobs import completion_logprobs, prompt_logprobs
from vllm.entrypoints.openai.guided_request import guided_field, guided_params
from vllm.entrypoints.openai.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamChoice,
    CompletionStreamResponse,
    UsageInfo,
)
from vllm.entrypoints.openai.request_streams import collect_final, merge
from vllm.entrypoints.openai.serving_engine import OpenAIServing, base_request_id
from vllm.entrypoints.openai.sse_template import TextChunks
from vllm.outputs import RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    """Handler of /v1/completions."""

    async def _prompts(
        self, req: CompletionRequest, keep: int | None
    ) -> list[tuple[str | None, list[int]]]:
        """(text or None, token ids) per prompt, each cut to its last ``keep`` tokens
        (None: all); a cut text prompt's text is None (its echo is the kept tokens). Texts
        get the tokenizer's special tokens unless ``add_special_tokens`` is false."""
        p = req.prompt
        if isinstance(p, list) and p and any(isinstance(t, int) for t in p):
            if not all(isinstance(t, int) for t in p):
                raise APIError("prompt mixes token ids with texts or id lists.", 400, "prompt")
            p = [p]
        elif isinstance(p, str):
            p = [p]
        if not p:
            raise APIError("prompt must not be empty (got an empty list).", 400, "prompt")
        out = []
        for item in p:
            ids = await self.item_ids(item, "prompt", keep is None, req.add_special_tokens)
            text = item if isinstance(item, str) else None
            if keep is not None and len(ids) > keep:
                text, ids = None, ids[-keep:]
            out.append((text, ids))
        return out

    def _check_unsupported(self, req: CompletionRequest) -> None:
        """Raises APIError 400 for fields this server refuses (``suffix``,
        ``prompt_logprobs`` with ``stream``, ``best_of`` other than 1 or n)."""
        if req.suffix is not None:
            raise APIError("suffix is not currently supported.", 400, "suffix")
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(
                "prompt_logprobs are not available when stream is true.", 400, "prompt_logprobs"
            )
        self.check_best_of(req)

    async def create_completion(self, req: CompletionRequest, raw: Request | None):
        """Returns a CompletionResponse, or an async iterator of SSE strings when streaming.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        self.check_model(req.model)
        self.check_generative("Completions")
        self.check_max_tokens(req.max_tokens, bool(req.echo))
        self._check_unsupported(req)
        prompts = await self._prompts(req, self.kept_tokens(req))
        echo_only = req.echo and req.max_tokens == 0
        prompt_lp = req.prompt_logprobs
        if req.echo and req.logprobs is not None:  # -1 (every token) covers any k
            both = (req.logprobs, prompt_lp if prompt_lp is not None else 0)
            prompt_lp = -1 if -1 in both else max(both)
        as_id = req.return_tokens_as_token_ids  # None: the server's flag; false turns it off
        params = []
        guided = guided_params(req)  # structured_outputs / response_format / guided_*
        # Every prompt is checked before any is queued.
        for _, ids in prompts:
            budget = self.check_length(len(ids), req.max_tokens, "prompt")
            if echo_only:  # the prompt alone must fit; the one token the engine runs is dropped
                budget = 1
            if req.use_beam_search:  # n beams, each step a request of its own
                params.append(self.beam_params(req, budget))
                self.check_schedulable(len(ids), 1, True)
                continue
            params.append(self.sampling_params(req, budget, req.logprobs, prompt_lp, guided))
            self.check_schedulable(len(ids), req.n, req.prompt_logprobs is None,
                                   max_tokens=params[-1].max_tokens)  # fmt: skip
        if params and not req.use_beam_search:  # the prompts' params differ only in max_tokens
            self.check_params(params[0])
            await self.check_guided(params[0], guided_field(req))
        base = f"cmpl-{base_request_id(raw, req.request_id)}"
        gens = [
            self.start(req, {"prompt": text, "prompt_token_ids": ids}, sp, f"{base}-{i}")
            for i, ((text, ids), sp) in enumerate(zip(prompts, params))
        ]
        created = int(time.time())
        if req.stream:
            return self._stream(req, prompts, gens, base, created, echo_only, as_id)

        async def finals():
            last: dict[int, RequestOutput] = {}
            async for i, out in merge(gens):
                last[i] = out
            yield last

        last = await collect_final(finals(), raw)
        if last is None:
            return None
        choices, completion_tokens = [], 0

        def name(token_id: int, lp=None) -> str:
            return self.token_text(token_id, as_id, lp)

        for i, (text, ids) in enumerate(prompts):
            out = last[i]
            prompt_text = text if text is not None else self.tokenizer.decode(ids)
            for o in out.outputs:
                tok_ids = [] if echo_only else list(o.token_ids)
                lps = [] if echo_only else list(o.logprobs or [])
                body = "" if echo_only else o.text
                completion_tokens += 0 if echo_only else o.num_generated_tokens()
                logprobs = None
                if req.logprobs is not None:
                    all_ids, all_lps = tok_ids, lps
                    if req.echo:
                        all_ids = ids + tok_ids
                        all_lps = list(out.prompt_logprobs or [None] * len(ids)) + lps
                    logprobs = completion_logprobs(all_ids, all_lps, req.logprobs, 0, name)
                choice = CompletionResponseChoice(
                    index=i * req.n + o.index,
                    text=(prompt_text + body) if req.echo else body,
                    logprobs=logprobs,
                    finish_reason="length" if echo_only else o.finish_reason,
                    stop_reason=None if echo_only else o.stop_reason,
                )
                if req.prompt_logprobs is not None:
                    choice.prompt_logprobs = prompt_logprobs(
                        ids, out.prompt_logprobs, req.prompt_logprobs, name
                    )
                if req.return_token_ids:
                    choice.prompt_token_ids, choice.token_ids = list(ids), tok_ids
                choices.append(choice)
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        cached = sum(last[i].num_cached_tokens for i in range(len(prompts)))
        usage = self.usage(prompt_tokens, completion_tokens, cached)
        return CompletionResponse(
            id=base, created=created, model=self.model_for(req), choices=choices, usage=usage
        )

    async def _stream(
        self, req, prompts, gens, base, created, echo_only, as_id
    ) -> AsyncIterator[str]:
        """One chunk per generated token of each choice (the last one, sent once, has
        finish_reason);
        with ``continuous_usage_stats`` each carries its choice's usage so far (its prompt
        and its tokens, as upstream); the final usage chunk counts every choice. Both need
        ``include_usage`` (true by default in ``stream_options``, as upstream) or
        ``--enable-force-include-usage``, as for chat."""
        n = req.n
        opts = req.stream_options
        include_usage = self.force_include_usage or (opts is not None and bool(opts.include_usage))
        continuous = include_usage and opts is not None and bool(opts.continuous_usage_stats)
        prompt_tokens = sum(len(ids) for _, ids in prompts)

        def name(token_id: int, lp=None) -> str:
            return self.token_text(token_id, as_id, lp)

        cached = [0] * len(prompts)  # prompt tokens read from the prefix cache, per prompt

        def usage() -> UsageInfo:
            return self.usage(prompt_tokens, sum(generated), sum(cached))

        def choice_usage(i: int, idx: int) -> UsageInfo:
            """One choice's usage so far (its prompt, its tokens), as upstream's chunks."""
            return self.usage(len(prompts[i][1]), generated[idx], cached[i])

        sent_tokens = [0] * (len(prompts) * n)
        generated = [0] * (len(prompts) * n)  # tokens generated, see OpenAIServing.usage
        sent_chars = [0] * (len(prompts) * n)
        next_offset = [0] * (len(prompts) * n)  # text_offset of the next logprobs token
        echoed = [False] * (len(prompts) * n)
        finished = [False] * (len(prompts) * n)  # the choice's final chunk went out
        with_ids = bool(req.return_token_ids)
        ids_sent = [False] * (len(prompts) * n)  # the choice's prompt_token_ids went out
        plain = TextChunks(  # the usual chunk: only its text changes
            lambda index, text: CompletionStreamResponse(
                id=base,
                created=created,
                model=self.model_for(req),
                choices=[CompletionStreamChoice(index=index, text=text)],
            )  # fmt: skip
        )
        try:
            async for i, out in merge(gens):
                text, ids = prompts[i]
                cached[i] = out.num_cached_tokens
                for o in out.outputs:
                    idx = i * n + o.index
                    if finished[idx]:  # a finished sibling repeats until the request ends
                        continue
                    finished[idx] = o.finish_reason is not None
                    generated[idx] = 0 if echo_only else o.num_generated_tokens()
                    new_ids = list(o.token_ids[sent_tokens[idx] :])
                    if echo_only:
                        if not o.finish_reason:
                            continue
                        new_ids = []
                    elif not new_ids and not o.finish_reason:
                        continue
                    delta = "" if echo_only else o.text[sent_chars[idx] :]
                    lp_ids, lp_list, offset = new_ids, [], next_offset[idx]
                    if not echo_only and o.logprobs is not None:
                        lp_list = list(o.logprobs[sent_tokens[idx] :])
                    if req.echo and not echoed[idx]:
                        echoed[idx] = True
                        prompt_text = text if text is not None else self.tokenizer.decode(ids)
                        delta = prompt_text + delta
                        lp_ids = ids + new_ids
                        lp_list = list(out.prompt_logprobs or [None] * len(ids)) + lp_list
                    logprobs = None
                    if req.logprobs is not None:
                        logprobs = completion_logprobs(lp_ids, lp_list, req.logprobs, offset, name)
                        next_offset[idx] = offset + sum(len(t) for t in logprobs.tokens)
                    sent_tokens[idx] += len(new_ids)
                    sent_chars[idx] = max(sent_chars[idx], len(o.text))
                    finish = o.finish_reason
                    if (
                        logprobs is None
                        and not finish
                        and not echo_only
                        and o.stop_reason is None
                        and not continuous
                        and not with_ids
                    ):
                        yield plain.format(idx, delta)
                        continue
                    chunk = CompletionStreamResponse(
                        id=base,
                        created=created,
                        model=self.model_for(req),
                        usage=choice_usage(i, idx) if continuous else None,
                        choices=[
                            CompletionStreamChoice(
                                index=idx,
                                text=delta,
                                logprobs=logprobs,
                                finish_reason="length" if echo_only and finish else finish,
                                stop_reason=None if echo_only else o.stop_reason,
                                prompt_token_ids=(
                                    list(ids) if with_ids and not ids_sent[idx] else None
                                ),
                                token_ids=new_ids if with_ids else None,
                            )
                        ],
                    )
                    ids_sent[idx] = True
                    yield f"data: {chunk.model_dump_json(exclude_unset=False)}\n\n"
            if include_usage:
                chunk = CompletionStreamResponse(
                    id=base, created=created, model=self.model_for(req), choices=[], usage=usage()
                )
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as e:
            yield to_api_error(e).sse()
        yield "data: [DONE]\n\n"
