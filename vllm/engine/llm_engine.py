"""LLMEngine: requests in, RequestOutputs out, one Scheduler per virtual engine.

A step: pick a virtual engine (VE) with work -> its scheduler's ``schedule()`` ->
``ExecuteModelRequest(virtual_engine=v)`` -> executor -> SamplerOutput -> append tokens,
detokenize, check stop conditions -> free finished sequences -> RequestOutputs.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

from vllm.bad_words import bad_words_token_ids
from vllm.config import EngineConfig
from vllm.core.scheduler import Scheduler, SchedulerOutputs
from vllm.engine import output_processor
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.detokenizer import fill_decoded_tokens
from vllm.engine.lora_api import LoRAMethods
from vllm.engine.rpc_api import WorkerCallMethods
from vllm.engine.stats_log import ThroughputLog
from vllm.engine.step_report import StepReport
from vllm.inputs import PromptType, prompt_cache_salt
from vllm.lora.registry import AdapterRegistry
from vllm.lora.request import LoRARequest
from vllm.model_executor.guided_decoding.manager import GuidedDecodingManager
from vllm.model_executor.models import architectures_of, get_model_class
from vllm.outputs import DeltaOutputs, RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import RequestOutputKind, SamplingParams, as_int, is_int
from vllm.sequence import (
    ExecuteModelRequest,
    SamplerOutput,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from vllm.transformers_utils.generation_config import load_generation_defaults
from vllm.transformers_utils.tokenizer import get_tokenizer
from vllm.worker.startup_summary import format_summary

logger = logging.getLogger(__name__)


def get_executor_class(config: EngineConfig):
    """The executor class for ``distributed_executor_backend`` ("uni", "mp", "ray")."""
    backend = config.parallel_config.distributed_executor_backend
    if backend == "uni":
        from vllm.executor.uniproc_executor import UniProcExecutor

        return UniProcExecutor
    if backend == "mp":
        from vllm.executor.mp_executor import MultiprocessingExecutor

        return MultiprocessingExecutor
    from vllm.executor.ray_executor import RayExecutor

    return RayExecutor


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


# Prompt dict fields of upstream's multimodal inputs: refused, never silently dropped.
_UNSUPPORTED_PROMPT_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids")


class LLMEngine(LoRAMethods, WorkerCallMethods):
    """The synchronous engine.

    Args:
        config: a validated EngineConfig.
        executor_class: the executor to start (see :func:`get_executor_class`).
        log_stats: log throughput statistics.

    Attributes:
        stream_outputs: True (default): :meth:`step` returns a RequestOutput for every
            scheduled request; False: only for requests that finished in that step.

    Start-up objects are moved out of the cyclic garbage collector's reach when the engine
    is built (``gc.freeze()``); :meth:`shutdown` undoes it.
    """

    def __init__(self, config: EngineConfig, executor_class: type, log_stats: bool = True):
        self.config = config
        self.model_config = config.model_config
        self.scheduler_config = config.scheduler_config
        self.log_stats = log_stats
        # The periodic stats line of step()'s callers (the offline LLM with
        # disable_log_stats=False); the async engine logs through its EngineMetrics.
        self.stats_log = ThroughputLog() if log_stats else None
        self.tokenizer = None
        if not self.model_config.skip_tokenizer_init:
            mc = self.model_config
            self.tokenizer = get_tokenizer(mc.tokenizer, mc.tokenizer_mode, mc.trust_remote_code)
        # generation_config.json: its end-of-sequence ids besides the tokenizer's become
        # every request's stop token ids (unless ignore_eos); its sampling fields are the
        # defaults of the offline API and the server.
        self.generation_defaults = load_generation_defaults(
            self.model_config.model,
            self.model_config.generation_config,
            self.model_config.override_generation_config,
        )
        self.extra_stop_token_ids = [
            t for t in self.generation_defaults.eos_token_ids if t != self.eos_token_id
        ]
        if self.generation_defaults.sampling:
            logger.info(
                "Default sampling parameters from %s (requests that leave them out; "
                "--generation-config vllm ignores the file): %s",
                self.generation_defaults.describe_source(),
                self.generation_defaults.sampling,
            )
        self.executor = executor_class(config)
        logger.info("%s", format_summary(config, self.executor.startup_summaries()))
        self.schedulers = [
            Scheduler(config.scheduler_config, config.cache_config, config.lora_config)
            for _ in range(config.num_virtual_engines)
        ]
        hf_config = self.model_config.hf_config
        self.adapters = AdapterRegistry(
            config.lora_config,
            hf_config,
            get_model_class(architectures_of(hf_config)).lora_target_modules,
        )
        self.seq_counter = itertools.count()
        self._requests: dict[str, SequenceGroup] = {}
        self._profiling = False  # start_profile() ran without stop_profile()
        # Structured outputs: matchers of constrained sequences, and the requests whose
        # grammar is still compiling (not given to a scheduler until it is ready).
        self.guided = GuidedDecodingManager(
            self.tokenizer,
            self.model_config.tokenizer or self.model_config.model,
            self.model_config.vocab_size,
            self.eos_token_id,
        )
        self._grammar_wait: list[tuple[SequenceGroup, Future]] = []
        self._next_ve = 0
        # Pipelined stepping (executors with execute_model_async, e.g. mp): at most one
        # step in flight per VE; (ve, future, scheduler outputs) in submission order.
        self._pipelined = hasattr(self.executor, "execute_model_async")
        # Multi-step decoding under PP runs rounds: one call per VE, their passes
        # interleaved on every stage (vllm/worker/pp_stage.py).
        self._pp_multi_step = (
            config.parallel_config.pipeline_parallel_size > 1
            and config.scheduler_config.num_scheduler_steps > 1
        )
        self._in_flight: deque = deque()
        # Async output processing: per VE, the report of its last step, finished during
        # its next step (vllm/engine/step_report.py).
        self._reports: dict[int, StepReport] = {}
        self.max_steps_in_flight = 0  # the most steps ever in flight at once
        # request id -> the exception that failed it while its output was processed; the
        # request is finished as aborted and its blocks are freed (see process_outputs).
        self.failed_requests: dict[str, BaseException] = {}
        # True: every step returns a RequestOutput per scheduled group (streaming; the
        # async engine relies on it). False: only finished requests' outputs, which is all
        # the offline LLM.generate loop reads (it turns this off while it runs).
        self.stream_outputs = True
        # request id -> what step() has returned of a streamed DELTA request (see
        # _by_output_kind); dropped when it finishes or is aborted.
        self._deltas: dict[str, DeltaOutputs] = {}
        # Move everything built so far (modules, weights' wrappers, tokenizer, imports) out
        # of the cyclic collector's reach: otherwise each full collection, triggered by the
        # objects a step allocates, walks millions of start-up objects (~100 ms on CPU, a
        # few ms per step on average at batch 256). shutdown() unfreezes.
        gc.collect()
        gc.freeze()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, log_stats: bool | None = None) -> LLMEngine:
        """The engine of ``engine_args``; ``log_stats`` (the stats line of :meth:`step`):
        None takes ``not engine_args.disable_log_stats``."""
        config = engine_args.create_engine_config()
        if log_stats is None:
            log_stats = not engine_args.disable_log_stats
        return cls(config, get_executor_class(config), log_stats)

    # upstream V0's accessors, for scripts that read the configs through the engine
    def get_model_config(self):
        return self.model_config

    def get_parallel_config(self):
        return self.config.parallel_config

    def get_scheduler_config(self):
        return self.scheduler_config

    def get_decoding_config(self):
        return self.config.decoding_config

    def get_lora_config(self):
        return self.config.lora_config

    @property
    def cache_config(self):
        return self.config.cache_config

    @property
    def parallel_config(self):
        return self.config.parallel_config

    @property
    def vllm_config(self):
        """Upstream's name of the engine's whole config (:class:`EngineConfig`)."""
        return self.config

    def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("the tokenizer was not initialized (skip_tokenizer_init=True).")
        return self.tokenizer

    def set_tokenizer(self, tokenizer) -> None:
        """Replace the tokenizer (upstream's ``LLM.set_tokenizer``): later requests encode
        their prompts, decode their tokens, stop at its EOS and compile guided-decoding
        grammars with it. It must share the model's vocabulary (ids are not checked
        against it).

        Raises:
            ValueError: requests are still running (their text was made with the old one).
        """
        if self.has_unfinished_requests():
            raise ValueError(
                f"set_tokenizer() while {self.get_num_unfinished_requests()} requests run: "
                "finish or abort them first."
            )
        self.tokenizer = tokenizer
        self.extra_stop_token_ids = [
            t for t in self.generation_defaults.eos_token_ids if t != self.eos_token_id
        ]
        key = f"{self.model_config.tokenizer or self.model_config.model}#{uuid.uuid4().hex}"
        self.guided = GuidedDecodingManager(
            tokenizer, key, self.model_config.vocab_size, self.eos_token_id
        )

    @property
    def eos_token_id(self) -> int | None:
        return None if self.tokenizer is None else self.tokenizer.eos_token_id

    # -------------------------------------------------------------- requests
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

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
    ) -> None:
        """Queue one request on the virtual engine :meth:`choose_virtual_engine` picks.
        The arguments are in upstream's order (V0 and V1: ``lora_request`` fifth).

        Args:
            lora_request: the LoRA adapter to run it with (``enable_lora`` engines; see
                vllm/lora/registry.py for the checks).
            priority: lower is served first under ``--scheduling-policy priority`` (see
                vllm/core/priority.py); must be 0 under "fcfs".
        Raises:
            ValueError: a duplicate request id, a bad prompt (see :meth:`process_prompt`),
                params that do not fit the model (see :meth:`verify_params`), a request
                the scheduler could never run (see :meth:`check_schedulable`), or a
                guided-decoding constraint that does not parse (invalid JSON schema,
                regex or grammar, unsupported schema feature), a priority the policy
                does not allow (see :func:`check_priority`), a LoRA adapter the engine
                cannot serve.

        A request with ``guided_decoding`` whose grammar is still compiling (on the grammar
        cache's threads) is held back and given to a scheduler by a later :meth:`step`.
        """
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running.")
        priority = check_priority(priority, self.scheduler_config.policy)
        self.adapters.check(lora_request)
        params, pooling, text, ids = self.check_request(prompt, params)
        grammar = self.guided.grammar_future(params)
        if grammar is not None and grammar.done() and grammar.exception() is not None:
            kind = params.guided_decoding.kind
            raise ValueError(
                f"invalid guided {kind}: could not compile it ({grammar.exception()})."
            )
        params = params.clone()
        vocab = self.model_config.vocab_size  # -1: every token (checked in verify_params)
        if params.logprobs == -1:
            params.logprobs = vocab
        if params.prompt_logprobs == -1:
            params.prompt_logprobs = vocab
        if self.eos_token_id is not None and not params.ignore_eos:
            params.all_stop_token_ids.add(self.eos_token_id)
        if self.extra_stop_token_ids and not params.ignore_eos:
            extra = [t for t in self.extra_stop_token_ids if t not in params.stop_token_ids]
            params.stop_token_ids = list(params.stop_token_ids) + extra
            params.all_stop_token_ids.update(extra)
        if params.bad_words:
            params.bad_words_token_ids = bad_words_token_ids(params.bad_words, self._encode_plain)
        seqs = [
            Sequence(
                next(self.seq_counter),
                text,
                ids,
                self.config.cache_config.block_size,
                self.eos_token_id,
                keep_logprobs=params.logprobs is not None,
            )
            for _ in range(params.n)
        ]
        # what changes a block's KV (the adapter) or who may share it (the salt)
        keys = () if lora_request is None else (lora_request.lora_int_id,)
        salt = prompt_cache_salt(prompt)
        keys += () if salt is None else (("cache_salt", salt),)
        for seq in seqs:
            seq.block_hash_keys = keys
        group = SequenceGroup(
            request_id, seqs, params, arrival_time or time.time(), priority, lora_request
        )
        group.pooling_params = pooling
        self._requests[request_id] = group
        if grammar is None:
            self._schedule_group(group)
        elif grammar.done():
            self.guided.start(group, grammar.result())
            self._schedule_group(group)
        else:
            self._grammar_wait.append((group, grammar))

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

    def _schedule_group(self, group: SequenceGroup) -> None:
        ve = self.choose_virtual_engine(list(group.prompt_token_ids), group.seqs[0].block_hash_keys)
        group.virtual_engine = ve
        self.schedulers[ve].add_seq_group(group)

    def admit_compiled(self, block: bool = False) -> list[RequestOutput]:
        """Give the held-back requests whose grammar is compiled to a scheduler.

        Args:
            block: wait for at least one compilation when some are pending (used when no
                scheduler has other work).
        Returns:
            Finished outputs of requests whose compilation failed (aborted; the error is
            kept in :attr:`failed_requests`).
        """
        if not self._grammar_wait:
            return []
        if block:
            wait_futures([f for _, f in self._grammar_wait], return_when="FIRST_COMPLETED")
        failed: list[RequestOutput] = []
        still: list[tuple[SequenceGroup, Future]] = []
        for group, fut in self._grammar_wait:
            if not fut.done():
                still.append((group, fut))
            elif fut.exception() is not None:
                self.failed_requests[group.request_id] = fut.exception()
                for seq in group.seqs:
                    seq.status = SequenceStatus.FINISHED_ABORTED
                self._requests.pop(group.request_id, None)
                failed.append(self.make_request_output(group))
            else:
                self.guided.start(group, fut.result())
                self._schedule_group(group)
        self._grammar_wait = still
        return failed

    def choose_virtual_engine(self, token_ids: list[int], hash_keys: tuple = ()) -> int:
        """The virtual engine a new request with prompt ``token_ids`` (and its sequences'
        ``block_hash_keys``) goes to.

        The least loaded one (fewest unfinished requests, lowest index on ties), unless
        prefix caching is on and another engine caches a longer prefix of the prompt: the
        engine with the longest cached prefix (least loaded among equals) wins when its load
        exceeds the least load by at most ``cache_config.prefix_routing_margin``. The margin
        bounds the imbalance that a popular prefix can cause (once exceeded, the least
        loaded engine gets the request and caches the prefix too, after which both qualify).
        """
        schedulers = self.schedulers
        loads = [s.get_num_unfinished_seq_groups() for s in schedulers]
        least = min(range(len(loads)), key=loads.__getitem__)
        if len(schedulers) == 1 or not self.config.cache_config.enable_prefix_caching:
            return least
        cached = [
            s.block_manager.num_cached_prefix_tokens(token_ids, hash_keys) for s in schedulers
        ]
        best = min(range(len(loads)), key=lambda v: (-cached[v], loads[v], v))
        margin = self.config.cache_config.prefix_routing_margin
        if cached[best] > cached[least] and loads[best] - loads[least] <= margin:
            return best
        return least

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by id (unknown ids are ignored) and free their blocks."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            group = self._requests.pop(rid, None)
            self._deltas.pop(rid, None)
            if group is not None:
                held = [w for w in self._grammar_wait if w[0] is group]
                self.guided.free(s.seq_id for s in group.seqs)
                if held:  # never reached a scheduler
                    self._grammar_wait.remove(held[0])
                    continue
                self.schedulers[group.virtual_engine].abort_seq_group(rid)
                for report in self._reports.values():  # no output after the abort
                    report.drop(group)
                self.executor.free_sequences([s.seq_id for s in group.seqs])

    def start_profile(self) -> None:
        """Start every worker's torch profiler; traces go to ``VLLM_TORCH_PROFILER_DIR``
        (vllm/worker/profiler.py). Both conditions are checked here, before any worker is
        called (a worker's failed call would fail the pipeline).

        Raises:
            RuntimeError: the variable is unset, or a profile is already running.
        """
        from vllm import envs

        if not envs.VLLM_TORCH_PROFILER_DIR:
            raise RuntimeError(
                "profiling needs VLLM_TORCH_PROFILER_DIR, the directory the traces go to; "
                "set it before the engine starts."
            )
        if self._profiling:
            raise RuntimeError("a profile is already running: stop it first.")
        self.executor.profile(True)
        self._profiling = True

    def stop_profile(self) -> None:
        """Stop every worker's profiler and write the traces.

        Raises:
            RuntimeError: no profile is running.
        """
        if not self._profiling:
            raise RuntimeError("no profile is running: start one first.")
        self._profiling = False
        self.executor.profile(False)

    def reset_prefix_cache(self) -> bool:
        """Forget every virtual engine's cached prefix blocks (blocks held by running
        requests stay theirs). Returns True (upstream's signature; nothing can refuse)."""
        for s in self.schedulers:
            s.reset_prefix_cache()
        return True

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` names a request this engine still holds (queued, running,
        or finished but not yet removed); a new request may not take that id."""
        return request_id in self._requests

    def has_unfinished_requests(self) -> bool:
        """True while a request is held, queued or running, or a step's outputs are still
        to be returned (async output processing)."""
        if self._grammar_wait or self._reports:
            return True
        return any(s.has_unfinished_seqs() for s in self.schedulers)

    def take_report(self, ve: int) -> StepReport | None:
        """Remove and return virtual engine ``ve``'s held report (async output processing:
        the previous step's second half, vllm/engine/step_report.py), or None."""
        return self._reports.pop(ve, None)

    def hold_report(self, ve: int, report: StepReport) -> None:
        """Keep ``report`` as ``ve``'s previous step until the next step of ``ve`` takes it;
        an abort meanwhile drops its request from it (:meth:`abort_request`)."""
        self._reports[ve] = report

    def has_work(self, ve: int) -> bool:
        """True while virtual engine ``ve`` has a sequence to schedule or a held report."""
        return ve in self._reports or self.schedulers[ve].has_unfinished_seqs()

    def get_num_unfinished_requests(self) -> int:
        held = len(self._grammar_wait)
        return held + sum(s.get_num_unfinished_seq_groups() for s in self.schedulers)

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Run one step of the next virtual engine that has work (round robin).

        With a pipelining executor (one exposing ``execute_model_async``) see
        :meth:`_step_pipelined` instead.

        Requests held back for their grammar join first (waiting for one compilation
        only when nothing else can run).

        Returns RequestOutputs of the groups scheduled (and ignored) in this step, or with
        async output processing (``use_async_output_proc``) in the VE's previous step.
        """
        busy = self._in_flight or self._reports
        idle = not busy and not any(s.has_unfinished_seqs() for s in self.schedulers)
        failed = self.admit_compiled(block=idle)
        if self._pp_multi_step:
            outs = failed + self._step_round()
        elif self._pipelined:
            outs = failed + self._step_pipelined()
        else:
            outs = failed
            for _ in range(len(self.schedulers)):
                ve = self._next_ve
                self._next_ve = (self._next_ve + 1) % len(self.schedulers)
                if self.has_work(ve):
                    outs = failed + self.step_virtual_engine(ve)
                    break
        if self.stats_log is not None and self.stats_log.due():
            self._log_stats()
        return self._by_output_kind(outs)

    def _by_output_kind(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        """``outs`` as each request's ``SamplingParams.output_kind`` asks, as upstream V0's
        ``step()``: CUMULATIVE everything so far; DELTA only the tokens, text and
        logprobs added since the request's previous output; FINAL_ONLY nothing until the
        finished output."""
        shown = []
        for out in outs:
            rid = out.request_id
            if out.finished:
                delta = self._deltas.pop(rid, None)
                shown.append(out if delta is None else delta.apply(out))
                continue
            group = self._requests.get(rid)
            kind = getattr(group.sampling_params, "output_kind", None) if group else None
            if kind == RequestOutputKind.FINAL_ONLY:
                continue
            if kind == RequestOutputKind.DELTA:
                out = self._deltas.setdefault(rid, DeltaOutputs()).apply(out)
            shown.append(out)
        return shown

    def _log_stats(self) -> None:
        """The periodic stats line (vllm/engine/stats_log.py) with the gauges now."""
        g = self.scheduler_gauges()
        queried, hits = g["prefix_queries"], g["prefix_hits"]
        self.stats_log.log(
            g["num_running"], g["num_waiting"], g["cache_usage"], hits / queried if queried else 0.0
        )

    def scheduler_gauges(self) -> dict:
        """The schedulers' state now, summed over virtual engines (thread: the engine's):
        ``num_running`` / ``num_waiting`` requests, ``cache_usage`` (KV blocks in use, a
        fraction in [0, 1], mean over virtual engines), ``prefix_queries`` /
        ``prefix_hits`` (prompt tokens looked up in / found in the prefix cache since the
        start) and ``preemptions`` (since the start); the names of :class:`StepStats`'
        fields (vllm/engine/metrics.py)."""
        schedulers = self.schedulers
        return dict(
            num_running=sum(s.num_running for s in schedulers),
            num_waiting=sum(s.num_waiting for s in schedulers),
            cache_usage=sum(s.block_manager.usage() for s in schedulers) / len(schedulers),
            prefix_queries=sum(s.block_manager.num_queried_tokens for s in schedulers),
            prefix_hits=sum(s.block_manager.num_hit_tokens for s in schedulers),
            preemptions=sum(s.num_cumulative_preemption for s in schedulers),
        )

    def _step_pipelined(self) -> list[RequestOutput]:
        """Submit a step for every idle virtual engine with work, then wait for the oldest
        step in flight and return its outputs.

        A VE with a step in flight is never scheduled again until that step's output is
        processed (its sequences have no new token yet), so at most ``num_virtual_engines``
        steps are in flight, and outputs are processed in submission order (hence in
        order per VE). While stage 0 runs VE 1's step, stage 1 runs VE 0's: the pipeline
        stays busy when every VE has work.
        """
        results: list[RequestOutput] = []
        busy = {ve for ve, _, _ in self._in_flight}
        for _ in range(len(self.schedulers)):
            ve = self._next_ve
            self._next_ve = (self._next_ve + 1) % len(self.schedulers)
            if ve in busy or not self.schedulers[ve].has_unfinished_seqs():
                continue
            req, sched_out = self.schedule_step(ve)
            if not req.seq_group_metadata_list:
                results.extend(self.process_outputs(ve, sched_out, None))
                continue
            self._in_flight.append((ve, self.executor.execute_model_async(req), sched_out))
            busy.add(ve)
        self.max_steps_in_flight = max(self.max_steps_in_flight, len(self._in_flight))
        if self._in_flight:
            ve, fut, sched_out = self._in_flight.popleft()
            try:
                output = fut.result()
            except BaseException:
                self._in_flight.clear()
                raise
            results.extend(self.process_outputs(ve, sched_out, output))
        return results

    def _step_round(self) -> list[RequestOutput]:
        """Multi-step decoding under PP: schedule every virtual engine with work, submit
        their calls as one round (each stage interleaves the calls' passes, so the
        pipeline holds one VE per stage) and process every call's outputs.
        """
        results: list[RequestOutput] = []
        calls = []
        for ve in range(len(self.schedulers)):
            if not self.schedulers[ve].has_unfinished_seqs():
                continue
            req, sched_out = self.schedule_step(ve)
            if not req.seq_group_metadata_list:
                results.extend(self.process_outputs(ve, sched_out, None))
                continue
            calls.append((ve, req, sched_out))
        if not calls:
            return results
        self.max_steps_in_flight = max(self.max_steps_in_flight, len(calls))
        outputs = self.executor.execute_model_async([req for _, req, _ in calls]).result()
        for (ve, _, sched_out), output in zip(calls, outputs):
            results.extend(self.process_outputs(ve, sched_out, output))
        return results

    def schedule_step(self, ve: int) -> tuple[ExecuteModelRequest, SchedulerOutputs]:
        """Schedule one step of virtual engine ``ve`` (with the constrained sequences'
        token bitmasks, see vllm/model_executor/guided_decoding).

        Under PP with multi-step decoding the engine decides a decode call's number of
        passes (``num_steps``, see vllm/worker/multi_step.py ``decode_steps``) so every
        stage runs the same; a call with a constrained sequence runs one pass (its next
        mask needs the grammar matcher).
        """
        metadata, sched_out = self.schedulers[ve].schedule()
        self.guided.attach_masks(metadata)
        num_steps = 1
        guided = any(md.guided_bitmasks for md in metadata)
        if self._pp_multi_step and metadata and not metadata[0].is_prompt and not guided:
            from vllm.worker.multi_step import decode_steps

            sc = self.scheduler_config
            num_steps = decode_steps(metadata, sc.num_scheduler_steps, sc.max_model_len)
        req = ExecuteModelRequest(
            seq_group_metadata_list=metadata,
            virtual_engine=ve,
            num_lookahead_slots=sched_out.num_lookahead_slots,
            running_queue_size=sched_out.running_queue_size,
            num_steps=num_steps,
        )
        return req, sched_out

    def step_virtual_engine(self, ve: int) -> list[RequestOutput]:
        """Schedule, execute and process one step of virtual engine ``ve``.

        With async output processing the previous step's report of ``ve`` is finished while
        this step runs on the device, and its outputs are returned; this step's report
        waits for the next call (vllm/engine/step_report.py).
        """
        req, sched_out = self.schedule_step(ve)
        prev = self.take_report(ve)
        if not req.seq_group_metadata_list:
            done, _ = self.finish_report(ve, prev)
            return done + self.process_outputs(ve, sched_out, None)
        if prev is not None:
            req.async_callback = prev.finish
        try:
            output = self.executor.execute_model(req)
        except BaseException:
            if prev is not None:  # a later step returns its outputs
                self.hold_report(ve, prev)
            raise
        done, gone = self.finish_report(ve, prev)  # the worker has normally finished it already
        report = self.apply_outputs(ve, sched_out, output, gone)
        if self.model_config.use_async_output_proc:
            self.hold_report(ve, report)
            return done
        return done + self.finish_report(ve, report)[0]

    def process_outputs(
        self, ve: int, sched_out: SchedulerOutputs, output: SamplerOutput | None
    ) -> list[RequestOutput]:
        """Append sampled tokens, detokenize, apply stop conditions, free finished groups.

        Returns a RequestOutput per scheduled or ignored group, or only for the finished
        ones when :attr:`stream_outputs` is False.
        """
        return self.finish_report(ve, self.apply_outputs(ve, sched_out, output))[0]

    def apply_outputs(
        self,
        ve: int,
        sched_out: SchedulerOutputs,
        output: SamplerOutput | None,
        gone: set[str] = frozenset(),
    ) -> StepReport:
        """The first half of :meth:`process_outputs`: append the sampled tokens, apply the
        stop conditions, free finished groups (in the scheduler and the workers). Texts and
        RequestOutputs are left to the returned report's ``finish()``
        (vllm/engine/step_report.py). ``gone``: ids of requests already reported finished
        and freed (a text that failed in the previous step's report), left out here; so
        are requests aborted while this step ran (steps in flight under PP): the abort
        freed them, and they get no output after it. With ``output`` None (a failed step,
        whose requests the caller has just aborted) every group is reported."""
        now = time.time()
        pending: list[SequenceGroup] = []
        requests = self._requests
        if self.stats_log is not None:
            self.stats_log.add(sched_out.num_prompt_tokens, 0)
        if output is not None:
            process = self._process_group_output
            for group, group_out in zip(sched_out.scheduled_seq_groups, output.outputs):
                if requests.get(group.request_id) is not group:
                    continue  # aborted while its step ran (pipelined): freed, no output
                if self.stats_log is not None:  # (tokens sampled, a stop's rest included)
                    self.stats_log.add(0, sum(len(o.token_ids) for o in group_out.samples))
                try:
                    if process(group, group_out):
                        pending.append(group)
                except Exception as e:  # fail this request only; the step goes on
                    pending.append(group)  # the text of tokens appended before the error
                    self._fail_group(group, e)
                if group_out.samples:  # a prefill chunk that is not the last samples nothing
                    m = group.metrics
                    m.first_token_time = m.first_token_time or now
                    m.last_token_time = now
        freed: list[int] = []
        reported: list[SequenceGroup] = []
        stream = self.stream_outputs
        for group in itertools.chain(sched_out.ignored_seq_groups, sched_out.scheduled_seq_groups):
            if group.request_id in gone or (
                output is not None and requests.get(group.request_id) is not group
            ):
                continue
            if group.is_finished():
                group.metrics.finished_time = now
                self._requests.pop(group.request_id, None)
                freed.extend(s.seq_id for s in group.seqs)
            elif not stream or group.is_partial_prefill:  # a partial prefill has no news
                continue
            reported.append(group)
        self._free(ve, freed)
        return StepReport(reported, pending, self.tokenizer, stream, self._fail_group)

    def _free(self, ve: int, seq_ids: list[int]) -> None:
        """Free finished sequences in the workers (one call, so one message for
        multi-process executors, per step) and the grammar matchers, then drop finished
        groups from the scheduler."""
        if seq_ids:
            self.executor.free_sequences(seq_ids)
            self.guided.free(seq_ids)
        self.schedulers[ve].free_finished_seq_groups()

    def finish_report(
        self, ve: int, report: StepReport | None
    ) -> tuple[list[RequestOutput], set[str]]:
        """``report.finish()``, then free the requests whose text failed in it (outside the
        worker's call: freeing calls into the executor). Returns the outputs and the ids of
        those requests (already reported finished)."""
        if report is None:
            return [], set()
        outs = report.finish()
        gone = {g.request_id for g in report.failed}
        freed = []
        for group in report.failed:
            if self._requests.pop(group.request_id, None) is not None:
                freed.extend(s.seq_id for s in group.seqs)
        report.failed = []
        if gone:
            self._free(ve, freed)
        return outs, gone

    def _fail_group(self, group: SequenceGroup, err: Exception) -> None:
        """A request whose output processing raised: finished as aborted (and freed with
        its step's other finished requests), the error kept in :attr:`failed_requests`."""
        logger.error("Request %s failed in output processing.", group.request_id, exc_info=err)
        self.failed_requests[group.request_id] = err
        for seq in group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_ABORTED

    def _process_group_output(self, group: SequenceGroup, group_out) -> bool:
        """Append one step's samples of ``group`` (output_processor.append_samples); True
        when its text is left to the step's report. A pooled vector (embedding engines)
        is kept, cut to the request's ``dimensions`` and normalized as it asks
        (vllm/pooling/pooler.py ``finish_vector``)."""
        if group_out.pooled is not None and group.pooling_params is not None:
            from vllm.pooling.pooler import finish_vector

            group.pooled = finish_vector(
                group_out.pooled, group.pooling_params, self.config.pooler_config
            )
        lps = group_out.prompt_logprobs
        if lps is not None:
            if group.sampling_params.detokenize:
                fill_decoded_tokens(self.tokenizer, lps)
            # A prefill from position 0 (entry None) sets them, a later chunk's extend them;
            # a recompute computes none.
            if group.prompt_logprobs is None or (lps and lps[0] is None):
                group.prompt_logprobs = lps
            else:
                group.prompt_logprobs.extend(lps)
        guided = group.sampling_params.guided_decoding is not None
        old_lens = {s.seq_id: s.get_output_len() for s in group.seqs} if guided else None
        # A grammar can end a sequence after its tokens are appended (guided.accept): such
        # a group is detokenized at once, as the grammar's stop keeps its last token's text.
        deferred = output_processor.append_samples(
            group, group_out, self.tokenizer, self.scheduler_config.max_model_len,
            defer_text=not guided,
        )  # fmt: skip
        if guided:
            self.guided.accept(group, old_lens)
        return deferred

    @staticmethod
    def make_request_output(group: SequenceGroup) -> RequestOutput:
        """Snapshot a group as a RequestOutput (see output_processor.py)."""
        return output_processor.make_request_output(group)

    def spec_decode_metrics(self) -> dict | None:
        """Speculative-decoding counters (vllm/spec_decode/metrics.py), None when off."""
        if self.config.speculative_config is None:
            return None
        get = getattr(self.executor, "spec_decode_metrics", None)
        return get() if get is not None else None

    def decode_step_counters(self) -> dict:
        """Graph-replay / eager decode-step counters from the workers."""
        return self.executor.decode_step_counters()

    def shutdown(self) -> None:
        # Frozen objects are never collected: unfreeze so the executor's gc.collect() can
        # free this engine's model and caches (and their device memory).
        gc.unfreeze()
        self.executor.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass
