"""What the engine checks of a request before anything is queued: the prompt (text, ids or a
prompt dict; tokenized here), the sampling or pooling parameters against the model, the
scheduler's limits, and the priority against the scheduling policy. ``LLMEngine`` mixes the
methods in and ``add_request`` runs them (``check_priority``, then ``check_request``); the
offline ``LLM`` and the async engine ask ``check_request`` / ``verify_params`` /
``check_schedulable`` before they queue a batch or open a stream, so a bad request gets a
ValueError naming the value and the limit and never reaches a scheduler.
"""

from __future__ import annotations

from vllm.inputs import PromptType, prompt_cache_salt
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams, as_int, is_int

# Prompt dict fields of upstream's multimodal inputs: refused, never silently dropped.
_UNSUPPORTED_PROMPT_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids")


def check_priority(priority: object, policy: str) -> int:
    """A request's scheduling priority, checked against the engine's policy.

    Returns:
        ``priority`` as an int (lower is served first under the "priority" policy).
    Raises:
        ValueError: not an integer, or non-zero under the "fcfs" policy (upstream's rule:
            priorities need ``--scheduling-policy priority``).
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}.")
    if priority != 0 and policy != "priority":
        raise ValueError(
            f"got priority={priority} but priority scheduling is not enabled: start the "
            "engine with scheduling_policy='priority' (--scheduling-policy priority)."
        )
    return int(priority)


class RequestChecks:
    """The checks; the class they are mixed into provides ``config``, ``model_config``,
    ``scheduler_config``, ``schedulers``, ``tokenizer``, ``eos_token_id`` and
    ``extra_stop_token_ids`` (vllm/engine/llm_engine.py)."""

    def process_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Validate and tokenize one prompt.

        Accepts text, ``{"prompt": text}``, ``{"prompt_token_ids": [...]}`` (optionally with
        its ``"prompt"`` text, then not tokenized again) or a list of ids.

        Raises:
            ValueError: empty prompt, ids outside [0, vocab_size), text without a tokenizer,
                multimodal fields (``multi_modal_data``, ``mm_processor_kwargs``), a
                ``cache_salt`` that is not a non-empty string.
        """
        text: str | None = None
        ids = None
        prompt_cache_salt(prompt)
        if isinstance(prompt, dict):
            unsupported = [k for k in _UNSUPPORTED_PROMPT_KEYS if prompt.get(k)]
            if unsupported:
                raise ValueError(
                    f"prompt field(s) {unsupported} are not supported: this engine serves "
                    "text-only models (prompt text or prompt_token_ids)."
                )
            if "prompt_token_ids" in prompt:
                given = prompt["prompt_token_ids"]
                if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
                    raise ValueError(
                        f"prompt_token_ids must be a list of token ids, got {given!r}."
                    )
                ids = list(given)
                text = prompt.get("prompt")
            elif "prompt" in prompt:
                text = prompt["prompt"]
                if not isinstance(text, str):
                    raise ValueError(f"a prompt dict's 'prompt' must be a string, got {text!r}.")
            else:
                raise ValueError(
                    f"a prompt dict needs 'prompt' or 'prompt_token_ids', got {list(prompt)}."
                )
        elif isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
        else:
            raise ValueError(f"unsupported prompt type {type(prompt).__name__}.")
        if ids is None:
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (skip_tokenizer_init=True).")
            ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError(f"The prompt is empty (prompt={text!r}): it has no tokens.")
        ids = [as_int(t) for t in ids]  # numpy integers count as ints; floats, bools do not
        not_int = [t for t in ids if not is_int(t)]
        if not_int:
            raise ValueError(
                f"Token id {not_int[0]!r} is not an integer (prompt token ids are ints)."
            )
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if t < 0 or t >= vocab]
        if bad:
            raise ValueError(
                f"Token id {bad[0]!r} is out of vocabulary (valid ids: 0..{vocab - 1})."
            )
        return text, ids

    def _encode_plain(self, text: str) -> list[int]:
        """``text``'s token ids without special tokens (how words appear inside text)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def end_token_ids(self) -> set[int]:
        """Every id that ends a sequence unless ``ignore_eos``: the tokenizer's EOS and the
        extra ones generation_config.json lists (what :meth:`add_request` adds to each
        request's stop ids; beam search reads it too)."""
        ids = set(self.extra_stop_token_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return ids

    def truncate_prompt(self, ids: list[int], params: SamplingParams) -> list[int]:
        """``ids`` cut to their last ``params.truncate_prompt_tokens`` (-1: max_model_len)
        tokens; unchanged when it is None.

        Raises:
            ValueError: truncate_prompt_tokens above max_model_len.
        """
        k = params.truncate_prompt_tokens
        if k is None:
            return ids
        max_len = self.scheduler_config.max_model_len
        if k > max_len:
            raise ValueError(f"truncate_prompt_tokens={k} is more than max_model_len={max_len}.")
        return ids[-(max_len if k == -1 else k) :]

    def verify_params(self, params: SamplingParams) -> None:
        """Check the parts of ``params`` that depend on the model (vocabulary size).

        Raises:
            ValueError: logprobs / prompt_logprobs above ``max_logprobs`` (``--max-logprobs``)
                or the vocabulary size, or a stop_token_ids, logit_bias or
                allowed_token_ids entry outside [0, vocab_size).
        """
        vocab = self.model_config.vocab_size
        limit = self.model_config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k == -1 and limit >= 0 and vocab > limit:
                raise ValueError(
                    f"{name}=-1 asks for the full vocabulary ({vocab}), more than "
                    f"max_logprobs={limit} (set --max-logprobs -1 for no limit)."
                )
            if k is not None and limit >= 0 and k > limit:
                raise ValueError(
                    f"{name}={k} is more than max_logprobs={limit} (raise --max-logprobs, "
                    "or -1 for up to the vocabulary size)."
                )
            if k is not None and k > vocab:
                raise ValueError(f"{name}={k} is more than the vocabulary size {vocab}.")
        if params.bad_words and self.tokenizer is None:
            raise ValueError("bad_words need a tokenizer (skip_tokenizer_init=True).")
        if params.stop and self.tokenizer is None:
            raise ValueError(
                f"stop strings {params.stop} need a tokenizer (skip_tokenizer_init=True): "
                "use stop_token_ids."
            )
        for t in params.stop_token_ids:
            if t >= vocab:
                raise ValueError(
                    f"stop_token_ids entry {t} is out of vocabulary (valid ids: 0..{vocab - 1})."
                )
        for name, ids in (
            ("logit_bias", params.logit_bias or ()),
            ("allowed_token_ids", params.allowed_token_ids or ()),
        ):
            bad = sorted(t for t in ids if t >= vocab)
            if bad:
                raise ValueError(
                    f"{name} token ids {bad} are out of vocabulary (valid ids: 0..{vocab - 1})."
                )

    def check_schedulable(
        self, prompt_len: int, n: int, reads_cache: bool = True, max_tokens: int | None = None
    ) -> None:
        """Refuse a request the scheduler could never run (the scheduler's own rule,
        :meth:`Scheduler.never_fits_reason`; every virtual engine has the same limits).

        With ``n`` > 1 the rule applies to the sequences at their longest too (prompt plus
        ``max_tokens``, None: up to ``max_model_len``): the scheduler preempts a group as a
        whole and recomputes all its sequences together, so a group whose sequences could
        outgrow the whole cache together would be cut short after a preemption (one
        sequence of ``max_model_len`` tokens always fits: the engine checks it at start).

        A prompt longer than ``max_model_len`` is refused too, as upstream's V1 does (its V0
        queued it and finished it with no tokens). Thread-safe: reads only configuration
        and cache sizes.
        ``reads_cache``: False for a request that asks for prompt logprobs, whose ``n``
        sequences then share no prefill (with prefix caching they share all but the
        prompt's last partial block).

        Raises:
            ValueError: naming the limit, e.g. a prompt longer than ``max_model_len``,
                ``n`` x prompt tokens above ``max_num_batched_tokens`` (without chunked
                prefill), ``n`` above ``max_num_seqs``, or more KV-cache blocks than the
                cache has.
        """
        max_len = self.scheduler_config.max_model_len
        if prompt_len > max_len:
            raise ValueError(
                f"The prompt ({prompt_len} tokens) is longer than max_model_len={max_len}: "
                "shorten it, or raise --max-model-len."
            )
        max_seqs = self.scheduler_config.max_num_seqs
        if n > max_seqs:  # before a list of n lengths is built (n may be huge)
            raise ValueError(
                f"This request can never be scheduled: n={n} sequences are more than "
                f"max_num_seqs={max_seqs}."
            )
        shared = prompt_len if reads_cache else 0
        reason = self.schedulers[0].never_fits_reason([prompt_len] * n, shared)
        if reason is not None:
            raise ValueError(
                f"This request can never be scheduled: {reason} (prompt of {prompt_len} "
                f"tokens, n={n})."
            )
        if n > 1:
            longest = max_len if max_tokens is None else min(prompt_len + max_tokens, max_len)
            bm = self.schedulers[0].block_manager
            needed = bm.blocks_needed([longest] * n, shared)
            total = bm.get_num_total_gpu_blocks()
            if total - needed < bm.watermark_blocks:
                raise ValueError(
                    f"This request can never be scheduled: its n={n} sequences may grow to "
                    f"{longest} tokens each (prompt of {prompt_len} + max_tokens), which "
                    f"takes {needed} KV-cache blocks, more than the {total} blocks of "
                    f"{bm.block_size} tokens (watermark {bm.watermark_blocks} blocks): lower "
                    "n or max_tokens."
                )

    def check_request(self, prompt: PromptType, params: SamplingParams | PoolingParams):
        """Check a request before it is queued: the params for this engine's task, the
        prompt, the params against the model, whether the scheduler could ever run it.

        Returns:
            (the SamplingParams it runs with, its PoolingParams or None, the prompt's text
            or None, its token ids after ``truncate_prompt_tokens``).
        Raises:
            ValueError: see :meth:`add_request`.
        """
        pooling = None
        if isinstance(params, PoolingParams):
            pooling, params = params, self.pooling_sampling_params(params)
        else:
            self.check_generation(params)
        text, ids = self.process_prompt(prompt)
        self.verify_params(params)
        ids = self.truncate_prompt(ids, params)
        self.check_schedulable(
            len(ids), params.n, params.prompt_logprobs is None, params.max_tokens
        )
        return params, pooling, text, ids

    def check_generation(self, params: object) -> None:
        """Raises ValueError when an embedding engine (``task='embed'``) gets a generation
        request."""
        if self.config.pooler_config is not None:
            raise ValueError(
                "this engine serves embeddings (task='embed'): use LLM.embed / LLM.encode "
                "(or /v1/embeddings), not generation."
            )

    def pooling_sampling_params(self, pooling: PoolingParams) -> SamplingParams:
        """The SamplingParams a pooling request runs under: its prompt's prefill samples
        one token that nobody reads (vllm/pooling).

        Raises:
            ValueError: a generative engine (no ``task='embed'``), or ``dimensions`` the
                model cannot give (not a Matryoshka model, above the hidden size, or not
                one of the config's ``matryoshka_dimensions`` when it lists them).
        """
        if self.config.pooler_config is None:
            raise ValueError(
                "pooling requests (LLM.embed / LLM.encode, /v1/embeddings) need an "
                "embedding engine: start it with task='embed' (--task embed)."
            )
        if pooling.dimensions is not None:
            hf = self.model_config.hf_config
            if not (
                getattr(hf, "is_matryoshka", False) or getattr(hf, "matryoshka_dimensions", None)
            ):
                raise ValueError(
                    f"dimensions={pooling.dimensions}: the model does not support Matryoshka "
                    "representations (no is_matryoshka / matryoshka_dimensions in its config)."
                )
            if pooling.dimensions > hf.hidden_size:
                raise ValueError(
                    f"dimensions={pooling.dimensions} is above the model's hidden size "
                    f"{hf.hidden_size}."
                )
            listed = getattr(hf, "matryoshka_dimensions", None)
            if listed and pooling.dimensions not in listed:  # as upstream: only those trained
                raise ValueError(
                    f"dimensions={pooling.dimensions}: the model supports only its "
                    f"matryoshka_dimensions {list(listed)}; other sizes give poor embeddings."
                )
        return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                              truncate_prompt_tokens=pooling.truncate_prompt_tokens)  # fmt: skip
