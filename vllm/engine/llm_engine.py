"""LLMEngine: requests in, RequestOutputs out, one Scheduler per virtual engine.

A step: pick a virtual engine (VE) with work -> its scheduler's ``schedule()`` ->
``ExecuteModelRequest(virtual_engine=v)`` -> executor -> SamplerOutput -> append tokens,
detokenize, check stop conditions -> free finished sequences -> RequestOutputs.

This file holds the engine's state and its request table (add, abort, admit requests whose
grammar compiled, pick a virtual engine); the checks a request passes before it is queued
are in vllm/engine/request_checks.py, the step in vllm/engine/engine_steps.py.
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
from vllm.core.scheduler import Scheduler
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.engine_steps import StepMethods
from vllm.engine.lora_api import LoRAMethods
from vllm.engine.request_checks import RequestChecks, check_priority
from vllm.engine.rpc_api import WorkerCallMethods
from vllm.engine.stats_log import ThroughputLog
from vllm.engine.step_report import StepReport
from vllm.inputs import PromptType, prompt_cache_salt
from vllm.lora.registry import AdapterRegistry
from vllm.lora.request import LoRARequest
from vllm.model_executor.guided_decoding.manager import GuidedDecodingManager
from vllm.model_executor.models import architectures_of, get_model_class
from vllm.outputs import DeltaOutputs, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.sequence import (
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


class LLMEngine(RequestChecks, StepMethods, LoRAMethods, WorkerCallMethods):
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
            self.config.decoding_config.disable_any_whitespace,
        )
        self._grammar_wait: list[tuple[SequenceGroup, Future]] = []
        self._next_ve = 0
        # Pipelined stepping (executors with execute_model_async, e.g. mp): at most one
        # step in flight per VE; (ve, future, scheduler outputs) in submission order.
        self._pipelined = hasattr(self.executor, "execute_model_async")
        # Multi-step decoding under PP: the engine decides each call's passes; an executor
        # whose stages stream calls (vllm/worker/pp_stream.py) takes them one per VE as
        # pipelined steps, others in rounds of one call per VE, their passes interleaved
        # on every stage (vllm/worker/pp_stage.py).
        self._pp_multi_step = (
            config.parallel_config.pipeline_parallel_size > 1
            and config.scheduler_config.num_scheduler_steps > 1
        )
        self._pp_rounds = self._pp_multi_step and not getattr(self.executor, "streams_calls", False)
        self._in_flight: deque = deque()
        # A submit that failed right after a step's outputs were applied: raised by the
        # next step(), once those outputs are returned.
        self._submit_error: Exception | None = None
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
        When this call raises, nothing of the request stays in the engine (its id may be
        used again).
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
        keys = () if lora_request is None else (self.adapters.block_hash_key(lora_request),)
        salt = prompt_cache_salt(prompt)
        keys += () if salt is None else (("cache_salt", salt),)
        for seq in seqs:
            seq.block_hash_keys = keys
        group = SequenceGroup(
            request_id, seqs, params, arrival_time or time.time(), priority, lora_request
        )
        group.pooling_params = pooling
        self._requests[request_id] = group
        try:
            if grammar is None:
                self._schedule_group(group)
            elif grammar.done():
                self.guided.start(group, grammar.result())
                self._schedule_group(group)
            else:
                self._grammar_wait.append((group, grammar))
        except BaseException:  # not queued: the id and any matcher must not stay behind
            self._requests.pop(request_id, None)
            self.guided.free(s.seq_id for s in group.seqs)
            raise

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
