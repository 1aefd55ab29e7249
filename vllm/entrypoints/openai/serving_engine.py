"""What the completion and chat handlers share: model-name checks, context-length and
schedulability checks, tokenization off the event loop and SamplingParams from a request
(errors: api_errors.py; reading a request's outputs: request_streams.py).

Large inputs. Tokenizing a long text takes seconds; done on the event loop it would stall
/health and every other client's stream. So texts are tokenized (and chat templates
applied) on one tokenizer thread, and a text that cannot fit the context is refused before
tokenization: with no normalizer, a token covers at most ``max_chars_per_token`` characters
(the longest vocabulary entry; byte-level entries count bytes, never fewer than the
characters they cover), so a text longer than ``max_model_len x max_chars_per_token``
characters has more than ``max_model_len`` tokens whatever the tokenizer does with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.request_checks import check_priority
from vllm.engine.token_text import token_text as logprob_token_text
from vllm.entrypoints.openai.api_errors import APIError, param_of
from vllm.entrypoints.openai.protocol import PromptTokenUsageInfo, SamplingFields, UsageInfo
from vllm.entrypoints.openai.request_guards import FRESH_REQUEST_ID
from vllm.lora.request import LoRARequest
from vllm.sampling_params import (
    BeamSearchParams,
    GuidedDecodingParams,
    RequestOutputKind,
    SamplingParams,
)


def max_chars_per_token(tokenizer) -> int | None:
    """Most characters one token can cover (the longest vocabulary entry), or None when
    no safe bound is known: no tokenizer, not a fast tokenizer, or a normalizer that may
    remove characters before the model sees them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return None
    try:
        return max(1, max(len(t) for t in tokenizer.get_vocab()))
    except Exception:
        return None


def base_request_id(raw, body_id: str | None = None) -> str:
    """What a request's ids derive from, as upstream: the ``X-Request-Id`` header when the
    client sent a non-empty one, else the body's ``request_id``, else a fresh uuid4 hex
    (with ``--enable-request-id-headers`` the one the response's header carries). The
    handlers prefix it (``cmpl-``, ``chatcmpl-``, ``embd-``) for the response's ``id`` and
    the engine request id (a completion's prompt i runs as ``cmpl-<id>-<i>``, an
    embedding input as ``embd-<id>-<i>``); an engine id already in use by a request in
    flight gets a suffix (see :meth:`OpenAIServing.start`).

    Args:
        raw: the HTTP request (None when a handler is called directly).
        body_id: the request body's ``request_id`` field.
    """
    if raw is None:
        return body_id or uuid.uuid4().hex
    header = raw.headers.get("x-request-id")
    return header or body_id or raw.scope.get(FRESH_REQUEST_ID) or uuid.uuid4().hex


_LOGPROBS_WORD = re.compile(r"(?<![\w])logprobs(?![\w])")


def renamed_logprobs(message: str, field: str) -> str:
    """``message`` with its first bare ``logprobs`` (not ``prompt_logprobs`` or
    ``max_logprobs``) named ``field`` (chat's ``top_logprobs``)."""
    return _LOGPROBS_WORD.sub(field, message, count=1)


def clamped_logit_bias(bias: dict | None) -> dict | None:
    """A request's ``logit_bias`` with each value beyond [-100, 100] (OpenAI's range)
    clamped to it, as upstream's server clamps them: clients send large values such as
    1e9 to force or ban a token. Anything else (a NaN, a key that is no token id) is
    left for SamplingParams to refuse."""
    if not isinstance(bias, dict):
        return bias
    out = {}
    for key, value in bias.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            value = min(100.0, max(-100.0, float(value)))
        out[key] = value
    return out


def params_error(e: Exception, logprobs_field: str = "logprobs") -> APIError:
    """The 400 of a SamplingParams error ``e``: its ``param`` is the field the message
    names, the per-token logprobs count under the request's name ``logprobs_field``."""
    msg = str(e)
    param = param_of(msg)
    if param == "logprobs" and logprobs_field != "logprobs":
        param, msg = logprobs_field, renamed_logprobs(msg, logprobs_field)
    return APIError(msg, 400, param)


class OpenAIServing:
    """Base of the completion and chat handlers.

    Args:
        engine: the running AsyncLLMEngine.
        served_model_names: names accepted in ``model``; a response reports the one asked
            for (the first when the request names none).
        tokenize_pool: the one thread that tokenizes (shared by the handlers, so the
            tokenizer object is never used by two threads at once); a new one when None.
        return_tokens_as_token_ids: render logprobs tokens as "token_id:ID"
            (``--return-tokens-as-token-ids``; see :meth:`token_text`).
        enable_prompt_tokens_details: report ``usage.prompt_tokens_details.cached_tokens``
            (``--enable-prompt-tokens-details``; see :meth:`usage`).
        enable_force_include_usage: every stream ends with a usage chunk, as if it asked
            for ``stream_options.include_usage`` (``--enable-force-include-usage``).
        reasoning_token_ids: the ``--reasoning-parser``'s (start, end) tag ids when a
            constraint waits for the reasoning to end (``enable_in_reasoning`` false):
            every constrained request carries them
            (``GuidedDecodingParams.reasoning_token_ids``); None: constraints hold from
            the first token.
        loras: name -> LoRA adapter served as a model of that name (``--lora-modules``;
            the server's map, changed in place when adapters are loaded at run time); a
            request naming one runs with it.
    """

    def __init__(
        self,
        engine: AsyncLLMEngine,
        served_model_names: list[str],
        tokenize_pool: ThreadPoolExecutor | None = None,
        return_tokens_as_token_ids: bool = False,
        enable_prompt_tokens_details: bool = False,
        loras: dict[str, LoRARequest] | None = None,
        enable_force_include_usage: bool = False,
        reasoning_token_ids: tuple[int, int] | None = None,
    ):
        self.engine = engine
        self.reasoning_token_ids = reasoning_token_ids
        self.force_include_usage = enable_force_include_usage
        self.loras = {} if loras is None else loras
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.served_model_names = served_model_names
        self.max_model_len = engine.max_model_len
        self.default_sampling = engine.default_sampling  # generation_config.json's fields
        self.tokenizer = engine.tokenizer
        self.tokenize_pool = tokenize_pool or ThreadPoolExecutor(1, "vllm-tokenize")
        self.max_chars_per_token = max_chars_per_token(self.tokenizer)

    async def off_loop(self, fn, *args):
        """Run ``fn(*args)`` on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)

    def check_text(self, text: str, field: str, bounded: bool = True) -> None:
        """Refuse text that is not valid Unicode (a lone surrogate such as "\\ud800" from a
        JSON escape) or, when ``bounded``, that is certainly longer than the context (see
        the module docstring; a prompt that will be truncated is not bounded).

        Raises:
            APIError 400: naming ``field``, the position of the bad character, or the
                length, ``max_model_len`` and the characters-per-token bound.
        """
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise APIError(
                f"{field} is not valid Unicode: lone surrogate {text[e.start]!r} "
                f"(U+{ord(text[e.start]):04X}) at character {e.start}; surrogates must come "
                "in high/low pairs.",
                400,
                field,
            ) from None
        bound = self.max_chars_per_token
        if bounded and bound is not None and len(text) > self.max_model_len * bound:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, the {field} has {len(text)} characters, more than "
                f"{self.max_model_len} tokens of at most {bound} characters each can hold. "
                f"Please reduce the length of the {field}.",
                400,
                field,
            )

    async def item_ids(
        self,
        item: str | list[int],
        field: str,
        bounded: bool = True,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """One prompt (or embedding input) of a request as token ids: a text tokenized
        (:meth:`encode`, the tokenizer's special tokens added unless ``add_special_tokens``
        is false), a list of ids checked against the vocabulary.

        Raises:
            APIError 400: an empty text or list, a text without a tokenizer, an id outside
                the vocabulary (naming ``field``).
        """
        if isinstance(item, str):
            if not item:
                raise APIError(f"{field} must not be empty (got '').", 400, field)
            if self.tokenizer is None:
                raise APIError(f"text {field}s need a tokenizer.", 400, field)
            return await self.encode(item, field, bounded, add_special_tokens)
        ids = list(item)
        if not ids:
            raise APIError(f"{field} must not be empty (got no token ids).", 400, field)
        vocab = self.engine.model_config.vocab_size
        bad = [t for t in ids if t < 0 or t >= vocab]
        if bad:
            raise APIError(
                f"{field} token id {bad[0]} is out of vocabulary (0..{vocab - 1}).", 400, field
            )
        return ids

    async def encode(
        self, text: str, field: str, bounded: bool = True, add_special_tokens: bool = True
    ) -> list[int]:
        """Check (:meth:`check_text`) and tokenize ``text`` on the tokenizer thread."""
        self.check_text(text, field, bounded)
        tok = self.tokenizer
        return list(
            await self.off_loop(lambda: tok.encode(text, add_special_tokens=add_special_tokens))
        )

    def check_params(self, params: SamplingParams, logprobs_field: str = "logprobs") -> None:
        """Raises APIError 400 for params the model cannot serve (logprobs above
        ``--max-logprobs`` or the vocabulary size, token ids outside the vocabulary),
        before the request is queued. ``logprobs_field`` is the request's name for the
        per-token logprobs count ("top_logprobs" in chat)."""
        try:
            self.engine.verify_params(params)
        except ValueError as e:
            raise params_error(e, logprobs_field) from None

    def check_schedulable(
        self, prompt_len: int, n: int, reads_cache: bool = True, param: str = "prompt",
        max_tokens: int | None = None,
    ) -> None:  # fmt: skip
        """Raises APIError 400 when the scheduler could never run ``n`` sequences of
        ``prompt_len`` tokens (their prefill above max_num_batched_tokens, n above
        max_num_seqs, more KV blocks than the cache has, or with n > 1 more than it has
        once they reach ``max_tokens``; ``reads_cache``: False with prompt logprobs, see
        ``LLMEngine.check_schedulable``). The error names ``n`` when n is the cause, else
        ``param`` (the input field)."""
        try:
            self.engine.check_schedulable(prompt_len, n, reads_cache, max_tokens)
        except ValueError as e:
            by_n = "max_num_seqs" in str(e) or "lower n or max_tokens" in str(e)
            raise APIError(str(e), 400, "n" if by_n else param) from None

    @staticmethod
    def check_best_of(req: SamplingFields) -> None:
        """Raises APIError 400 naming ``best_of`` unless it is None, 1 or ``n`` (every
        sequence generated is returned; upstream's V1 engine dropped best_of > n)."""
        if req.best_of is not None and req.best_of not in (1, req.n):
            raise APIError(
                f"best_of={req.best_of} is not supported (only best_of equal to n={req.n}, "
                "or 1): ask for n completions with logprobs and rank them instead.",
                400,
                "best_of",
            )

    def check_priority(self, priority: int) -> None:
        """Raises APIError 400 naming ``priority`` when the scheduling policy refuses it
        (non-zero under ``fcfs``; see ``check_priority`` in vllm.engine.request_checks)."""
        try:
            check_priority(priority, self.engine.scheduling_policy)
        except ValueError as e:
            raise APIError(str(e), 400, "priority") from None

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def model_for(self, req) -> str:
        """The model name a response reports: the request's ``model`` when it is one of the
        served names (as upstream), else the first served name."""
        model = getattr(req, "model", None)
        return model if model in self.served_model_names or model in self.loras else self.model_name

    def check_generative(self, api: str) -> None:
        """Raises APIError 400 on an embedding engine (``--task embed``), which serves
        the pooling APIs only; ``api`` names the refused one."""
        if self.engine.pooler_config is not None:
            raise APIError(
                f"The model does not support the {api} API: it is served for embeddings "
                "(--task embed); use /v1/embeddings, /pooling, /score or /rerank.",
                400,
                "model",
            )

    def lora_for(self, req) -> LoRARequest | None:
        """The LoRA adapter the request's ``model`` names, or None (the base model)."""
        return self.loras.get(getattr(req, "model", None))

    def check_model(self, model: str | None) -> None:
        """Raises APIError 404, naming the served models and adapters, when ``model`` is
        given and is neither (an empty name, like none, is the first served model, as
        upstream)."""
        if model and model not in self.served_model_names and model not in self.loras:
            names = ", ".join(f"`{n}`" for n in [*self.served_model_names, *self.loras])
            raise APIError(
                f"The model `{model}` does not exist. Available models: {names}.", 404, "model"
            )

    def check_length(
        self, prompt_len: int, max_tokens: int | None, kind: str, field: str = "max_tokens"
    ) -> int:
        """Validate a prompt's length and return the completion budget.

        Args:
            prompt_len: prompt tokens.
            max_tokens: requested completion tokens, None for the rest of the context.
                Either way the budget is at most the generation config's
                ``max_new_tokens`` (or ``--override-generation-config``'s) when it sets one,
                as upstream's ``get_max_tokens`` takes the minimum.
            kind: "prompt" or "messages", for the message.
            field: the request field that set ``max_tokens`` (chat's
                ``max_completion_tokens``), named in the error.
        Raises:
            APIError 400: the prompt plus max_tokens exceeds max_model_len (both named).
        """
        if max_tokens is None:
            if prompt_len >= self.max_model_len:
                raise APIError(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, you requested {prompt_len} tokens in the {kind}, which leaves "
                    "no room for a completion. Please reduce the length of the "
                    f"{kind}.",
                    400,
                    kind,
                )
            rest = self.max_model_len - prompt_len
            return min(rest, self.default_sampling.get("max_tokens", rest))
        if prompt_len + max_tokens > self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {prompt_len + max_tokens} tokens ({prompt_len} in "
                f"the {kind}, {max_tokens} in the completion). Please reduce the length of "
                f"the {kind} or the completion ({field}).",
                400,
                # the prompt alone fits: max_tokens is what is too large
                kind if prompt_len >= self.max_model_len else field,
            )
        return min(max_tokens, self.default_sampling.get("max_tokens", max_tokens))

    def kept_tokens(self, req) -> int | None:
        """How many prompt tokens the request's ``truncate_prompt_tokens`` keeps (None:
        all; -1: max_model_len). The last ones are kept (left truncation, as upstream).

        Raises:
            APIError 400: k is 0, below -1, or above max_model_len.
        """
        k = req.truncate_prompt_tokens
        if k is None:
            return None
        if k == -1:
            return self.max_model_len
        if k < 1:
            raise APIError(
                f"truncate_prompt_tokens must be >= 1 (or -1 for max_model_len), got {k}.",
                400,
                "truncate_prompt_tokens",
            )
        if k > self.max_model_len:
            raise APIError(
                f"truncate_prompt_tokens={k} is more than this model's maximum context length "
                f"max_model_len={self.max_model_len}.",
                400,
                "truncate_prompt_tokens",
            )
        return k

    @staticmethod
    def check_max_tokens(
        max_tokens: int | None, echo: bool | None = None, field: str = "max_tokens"
    ) -> None:
        """Refuse max_tokens below 1; 0 is allowed for a completion with ``echo`` (the
        prompt alone). ``echo`` None: the endpoint has no such option (chat). ``field``: the
        request field that set it (chat's ``max_completion_tokens``).

        Raises:
            APIError 400 naming ``field``.
        """
        if max_tokens is None or max_tokens >= 1 or (max_tokens == 0 and echo):
            return
        hint = "" if echo is None else " (0 is allowed with echo=true)"
        raise APIError(f"{field} must be at least 1{hint}, got {max_tokens}.", 400, field)

    def sampling_params(
        self,
        req: SamplingFields,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        guided: GuidedDecodingParams | None = None,
        logprobs_field: str = "logprobs",
    ) -> SamplingParams:
        """SamplingParams for a request; raises APIError 400 on a bad value (the
        SamplingParams ValueError's message names the field and the limit; the request's
        name for the per-token logprobs count is ``logprobs_field``). ``guided``:
        the structured-output constraint (see guided_request.py / tool_calls.py), given
        the server's ``reasoning_token_ids``. temperature, top_p, top_k, min_p and
        repetition_penalty left out of the request take the generation config's value
        when it sets one (``--generation-config``), else SamplingParams' own default.
        ``logit_bias`` values are clamped to [-100, 100] (:func:`clamped_logit_bias`)."""
        self.refuse_logits_processors(req)
        d = self.default_sampling
        if guided is not None and self.reasoning_token_ids is not None:
            guided = dataclasses.replace(guided, reasoning_token_ids=self.reasoning_token_ids)

        def pick(name: str, fallback):
            value = getattr(req, name)
            return d.get(name, fallback) if value is None else value

        kw = dict(
            n=req.n,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            top_k=pick("top_k", -1),
            min_p=pick("min_p", 0.0),
            repetition_penalty=pick("repetition_penalty", 1.0),
            seed=req.seed,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            logit_bias=clamped_logit_bias(req.logit_bias),
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
            guided_decoding=guided,
            # A non-streamed request reads only its final output; it also fails (503)
            # instead of ending short when a shutdown aborts it (AsyncLLMEngine.abort_all).
            output_kind=RequestOutputKind.CUMULATIVE
            if req.stream
            else RequestOutputKind.FINAL_ONLY,
        )
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as e:
            raise params_error(e, logprobs_field) from e

    @staticmethod
    def refuse_logits_processors(req: SamplingFields) -> None:
        """Raises APIError 400 naming ``logits_processors`` when the request lists any:
        this server runs none (upstream refuses them too unless started with
        ``--logits-processor-pattern``), and ignoring them would change the output
        silently."""
        if req.logits_processors:
            raise APIError(
                "logits_processors are not supported by this server: use logit_bias, "
                "allowed_token_ids, bad_words or structured_outputs instead.",
                400,
                "logits_processors",
            )

    # Fields that change which tokens may come or where a sequence stops: beam search
    # (which scores the model's own logprobs and stops only at EOS or length) refuses them.
    _NOT_WITH_BEAM_SEARCH = (
        "stop", "stop_token_ids", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
        "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
        "guided_grammar", "prompt_logprobs", "priority",
    )  # fmt: skip

    def beam_params(self, req: SamplingFields, max_tokens: int) -> BeamSearchParams:
        """BeamSearchParams of a ``use_beam_search`` request: width ``n``, its max_tokens,
        ignore_eos, temperature (default 0), length_penalty, include_stop_str_in_output.

        Raises:
            APIError 400: a field beam search does not apply (named), or a bad width.
        """
        self.refuse_logits_processors(req)
        for name in self._NOT_WITH_BEAM_SEARCH:
            value = getattr(req, name, None)
            if value not in (None, 0, [], {}, ""):
                raise APIError(f"{name} is not supported with use_beam_search.", 400, name)
        try:
            params = BeamSearchParams(
                beam_width=req.n,
                max_tokens=max_tokens,
                ignore_eos=req.ignore_eos,
                temperature=req.temperature or 0.0,
                length_penalty=req.length_penalty,
                include_stop_str_in_output=req.include_stop_str_in_output,
            )
            params.check_limits(self.engine.model_config.max_logprobs)
        except ValueError as e:
            raise APIError(str(e).replace("beam_width", "n"), 400, "n") from e
        return params

    def start(self, req: SamplingFields, prompt: dict, params, request_id: str):
        """The request's output stream: a beam search of ``beam_params`` when the request
        asks for one, else ``engine.generate``. ``request_id`` comes from the client
        (:func:`base_request_id`), so two requests in flight may name the same one: the
        engine then runs the later one as ``<request_id>-<8 hex digits>``
        (``dedupe_request_id``), and neither touches the other's stream. The request's
        ``cache_salt`` goes into ``prompt``."""
        lora = self.lora_for(req)
        if req.cache_salt is not None:
            prompt = {**prompt, "cache_salt": req.cache_salt}
        if req.use_beam_search:
            return self.engine.beam_search(prompt, params, request_id, lora, dedupe_request_id=True)
        self.check_priority(req.priority)
        return self.engine.generate(
            prompt, params, request_id, lora_request=lora, priority=req.priority,
            dedupe_request_id=True,
        )  # fmt: skip

    async def check_guided(self, params: SamplingParams, param: str | None) -> None:
        """Parse and compile ``params``' constraint before the request is queued, so a bad
        schema, regex or grammar is a 400 even for a streamed request.

        Raises:
            APIError 400: naming the constraint and the reason, or, when xgrammar is not
                installed where the server runs, naming the package to install (the
                request asks for what this server cannot serve; a 5xx would be retried).
        """
        if params.guided_decoding is None:
            return
        try:
            await self.engine.prepare_grammar(params)
        except (ValueError, ImportError) as e:
            raise APIError(str(e), 400, param) from None

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        """A response's usage; with ``--enable-prompt-tokens-details`` it also says how many
        prompt tokens were read from the prefix cache (``RequestOutput.num_cached_tokens``,
        summed over the request's prompts).

        ``completion_tokens`` counts every token generated for the choices
        (:meth:`CompletionOutput.num_generated_tokens`), those a stop string cut off after
        they were generated included, as upstream counts them and as
        ``vllm:generation_tokens_total`` does: a streamed request reports the same number
        as the same request not streamed, completions and chat alike, although its
        ``token_ids`` (and the ids its chunks carried) may be fewer. An echo-only
        completion (``max_tokens`` 0) generates none."""
        details = None
        if self.enable_prompt_tokens_details:
            details = PromptTokenUsageInfo(cached_tokens=cached_tokens)
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
        )

    def token_text(self, token_id: int, as_id: bool | None = None, lp=None) -> str:
        """How a logprobs entry names a token: "token_id:ID" when ``as_id`` (None: the
        server's ``--return-tokens-as-token-ids``), so tokens that are part of a multi-byte
        character stay distinguishable; else its decoded text: ``lp.decoded_token`` when the
        engine filled it, else decoded here (both by vllm/engine/token_text.py; the id as
        text without a tokenizer)."""
        if as_id is None:
            as_id = self.return_tokens_as_token_ids
        if as_id:
            return f"token_id:{token_id}"
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        if self.tokenizer is None:
            return str(token_id)
        return logprob_token_text(self.tokenizer, token_id)
