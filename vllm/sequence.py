"""Sequences, sequence groups and the messages passed between engine, scheduler and worker.

This module never imports torch: the scheduler and block manager use it on CPU alone.
A *sequence* is one stream of tokens (prompt + generated); a *sequence group* is one request
(``n`` sequences that share a prompt and sampling params). Upstream vLLM's names are kept.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm.sampling_params import SamplingParams


class SequenceStatus(enum.IntEnum):
    """Lifecycle of one sequence; every value >= FINISHED_STOPPED is final."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2
    FINISHED_LENGTH_CAPPED = 3
    FINISHED_ABORTED = 4
    FINISHED_IGNORED = 5

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        return status >= SequenceStatus.FINISHED_STOPPED

    @staticmethod
    def get_finished_reason(status: SequenceStatus) -> str | None:
        """OpenAI-style finish reason: "stop", "length", "abort" or None while running.

        An ignored sequence (prompt longer than max_model_len) reports "length", as upstream.
        """
        return _FINISH_REASONS.get(status)


# Module constants for the hot paths (a global lookup is cheaper than an enum attribute).
_FIRST_FINISHED = SequenceStatus.FINISHED_STOPPED
_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "length",
}


@dataclass
class Logprob:
    """Log-probability of one token at one position (natural log, float32 precision).

    ``rank`` is 1 for the most likely token; ``decoded_token`` is its text when known.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One position's logprobs: token id -> Logprob.
PositionLogprobs = dict[int, Logprob]


class SequenceData:
    """The token ids of one sequence: prompt, then outputs, and their cumulative logprob."""

    def __init__(self, prompt_token_ids: list[int], output_token_ids: list[int] | None = None):
        self.prompt_token_ids: tuple[int, ...] = tuple(prompt_token_ids)
        self.output_token_ids: list[int] = list(output_token_ids or [])
        self.cumulative_logprob = 0.0

    def append_token_id(self, token_id: int, logprob: float) -> None:
        self.output_token_ids.append(token_id)
        self.cumulative_logprob += logprob

    def get_len(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def get_output_len(self) -> int:
        return len(self.output_token_ids)

    def get_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    def get_last_token_id(self) -> int:
        if self.output_token_ids:
            return self.output_token_ids[-1]
        return self.prompt_token_ids[-1]

    def __repr__(self) -> str:
        return (
            f"SequenceData(prompt_len={len(self.prompt_token_ids)}, "
            f"output_token_ids={self.output_token_ids})"
        )


class Sequence:
    """One generated stream of a request, with its detokenization state.

    Args:
        seq_id: engine-wide unique id.
        prompt: prompt text, or None for token-id prompts.
        prompt_token_ids: the prompt's token ids (non-empty).
        block_size: tokens per KV-cache block.
        eos_token_id: the tokenizer's EOS id, or None.
        keep_logprobs: keep each position's logprobs dict in ``output_logprobs`` (the
            engine sets it when the request asks for logprobs). Without it only the chosen
            tokens' logprobs are kept, as floats (``token_logprobs``): a dict and a
            ``Logprob`` per token are objects the garbage collector would traverse for the
            request's lifetime, hundreds of thousands of them in a large batch.
    """

    def __init__(
        self,
        seq_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        block_size: int,
        eos_token_id: int | None = None,
        keep_logprobs: bool = True,
    ):
        self.seq_id = seq_id
        self.prompt = prompt
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.keep_logprobs = keep_logprobs
        self.data = SequenceData(prompt_token_ids)
        self.output_logprobs: list[PositionLogprobs] = []
        # each output token's own logprob (0.0 where its position's dict lacks it)
        self.token_logprobs: list[float] = []
        self.output_text = ""
        self.status = SequenceStatus.WAITING
        # Hashed into every prefix-cache block of this sequence besides its tokens (the
        # LoRA adapter's id: blocks computed with one adapter serve only that adapter; the
        # prompt's cache_salt: blocks are shared only between requests of one salt).
        self.block_hash_keys: tuple = ()
        self.stop_reason: int | str | None = None
        # Incremental detokenization state (see vllm/engine/detokenizer.py).
        self.read_offset = 0
        self.prefix_offset = 0
        self.tokens: list[str] | None = None
        # The prompt tokens the first output tokens are decoded after (set at the first
        # decode, see detokenizer.prompt_context).
        self.detok_context: list[int] | None = None
        # The tokens the window starting at output index window_context_at is decoded
        # after (set when text-less tokens are left out of it, see detokenizer._step).
        self.window_context: list[int] = []
        self.window_context_at = -1
        # Tokens appended whose text is not decoded yet (output_processor.finish_text_of).
        self.text_pending = False
        # Output tokens a stop string cut off after they were appended (stop_checker.py):
        # generated all the same, so the step statistics still count them.
        self.num_cut_tokens = 0

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.data.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.data.output_token_ids

    def append_token_id(self, token_id: int, logprobs: PositionLogprobs) -> None:
        """Append one generated token and its position's logprobs (a position whose dict
        lacks ``token_id`` counts as logprob 0.0)."""
        self.append_token_ids(((token_id, logprobs),))

    def append_token_ids(self, tokens: tuple[tuple[int, PositionLogprobs], ...]) -> None:
        """Append generated (token id, logprobs) pairs in order (see :meth:`append_tokens`)."""
        ids = [t for t, _ in tokens]
        lps = [p[t].logprob if t in p else 0.0 for t, p in tokens]
        self.append_tokens(ids, lps, [p for _, p in tokens])

    def append_tokens(
        self,
        token_ids: list[int],
        token_logprobs: list[float],
        positions: list[PositionLogprobs] | None,
    ) -> None:
        """Append generated tokens in order: their ids, their own logprobs, and their
        positions' dicts (read only with ``keep_logprobs``; None is fine without). The
        cumulative logprob adds them one at a time, in order, so a chunk gives the same
        float as its tokens appended one by one.

        Raises:
            ValueError: ``keep_logprobs`` is set and ``positions`` is None.
        """
        if self.keep_logprobs:
            if positions is None:
                raise ValueError(f"sequence {self.seq_id} keeps logprobs; positions is None")
            self.output_logprobs.extend(positions)
        self.token_logprobs.extend(token_logprobs)
        data = self.data
        data.output_token_ids.extend(token_ids)
        cum = data.cumulative_logprob
        for lp in token_logprobs:
            cum += lp
        data.cumulative_logprob = cum

    def get_len(self) -> int:
        return self.data.get_len()

    def get_prompt_len(self) -> int:
        return self.data.get_prompt_len()

    def get_output_len(self) -> int:
        return self.data.get_output_len()

    def get_generated_len(self) -> int:
        """Tokens generated so far: the output tokens and those a stop string cut off
        (never decreases, unlike :meth:`get_output_len`)."""
        return len(self.data.output_token_ids) + self.num_cut_tokens

    def get_token_ids(self) -> list[int]:
        return self.data.get_token_ids()

    def get_last_token_id(self) -> int:
        return self.data.get_last_token_id()

    def is_finished(self) -> bool:
        return self.status >= _FIRST_FINISHED

    def __repr__(self) -> str:
        return f"Sequence(seq_id={self.seq_id}, status={self.status.name}, len={self.get_len()})"


@dataclass
class RequestMetrics:
    """Timestamps of one request, in seconds since the epoch (time.time())."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


class SequenceGroup:
    """One request: its ``n`` sequences, sampling params and timing.

    All sequences of a group are scheduled together and, on preemption, recomputed together.
    """

    def __init__(
        self,
        request_id: str,
        seqs: list[Sequence],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: Any = None,
    ):
        self.request_id = request_id
        self.seqs = seqs
        self.sampling_params = sampling_params
        # The LoRA adapter it runs with (vllm.lora.request.LoRARequest), or None.
        self.lora_request = lora_request
        # Embedding engines: the request's PoolingParams, and its vector once pooled.
        self.pooling_params: Any = None
        self.pooled: Any = None
        self.metrics = RequestMetrics(arrival_time=arrival_time or time.time())
        # Scheduling priority (lower first) under the "priority" policy.
        self.priority = priority
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        # Index into virtual engines; set by the engine.
        self.virtual_engine = 0
        # Prompt tokens found in the prefix cache at the first prefill (None before it).
        self.num_cached_tokens: int | None = None
        # Chunked prefill: while the group's prefill is partly done, the leading tokens of
        # each unfinished sequence whose KV is computed (or scheduled in the step in
        # flight); None when no partial prefill is under way.
        self.partial_prefill_tokens: int | None = None

    @property
    def lora_int_id(self) -> int:
        """The adapter's id, 0 without one."""
        return 0 if self.lora_request is None else self.lora_request.lora_int_id

    @property
    def is_partial_prefill(self) -> bool:
        """True while a chunked prefill of this group has chunks left to schedule."""
        return self.partial_prefill_tokens is not None

    @property
    def prompt(self) -> str | None:
        return self.seqs[0].prompt

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.seqs[0].prompt_token_ids

    @property
    def shared_prompt_len(self) -> int:
        """Prompt tokens whose KV the group's sequences may share through the prefix
        cache: the whole prompt, or 0 when the request asks for prompt logprobs (its
        prefill reads no cache)."""
        if self.sampling_params.prompt_logprobs is not None:
            return 0
        return len(self.prompt_token_ids)

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        """A new list of the group's sequences, all of them or those with ``status``."""
        seqs = self.seqs
        if status is None:
            return list(seqs)
        if len(seqs) == 1:  # n == 1: no comprehension
            return [seqs[0]] if seqs[0].status == status else []
        return [s for s in seqs if s.status == status]

    def get_unfinished_seqs(self) -> list[Sequence]:
        seqs = self.seqs
        if len(seqs) == 1:
            return [seqs[0]] if seqs[0].status < _FIRST_FINISHED else []
        return [s for s in seqs if s.status < _FIRST_FINISHED]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        if status is None:
            return len(self.seqs)
        count = 0
        for s in self.seqs:
            if s.status == status:
                count += 1
        return count

    def get_max_num_running_seqs(self) -> int:
        """Rows this group may occupy in a batch from now on (its unfinished sequences)."""
        count = 0
        for s in self.seqs:
            if s.status < _FIRST_FINISHED:
                count += 1
        return count

    def is_finished(self) -> bool:
        for s in self.seqs:
            if s.status < _FIRST_FINISHED:
                return False
        return True

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id}, num_seqs={len(self.seqs)})"


@dataclass
class SequenceGroupMetadata:
    """What the worker needs of one scheduled group for one step.

    Attributes:
        request_id: the request.
        is_prompt: True for a prefill (every token past ``computed_lens`` up to
            ``token_chunk_size`` of them is computed), False for a decode row.
        seq_data: seq_id -> SequenceData (token ids) for each scheduled sequence.
        sampling_params: the request's params.
        block_tables: seq_id -> physical block numbers of that sequence, in order (the
            block manager's own list: read-only, valid for the step it was made for).
        do_sample: False when no token is sampled this step (a prefill chunk that is not
            the last of its prompt).
        computed_lens: prefill over a cached context (prefix caching, or the earlier
            chunks of a chunked prefill): seq_id -> leading tokens whose KV is already in
            the cache (below the length); the step computes from there. None: nothing is
            cached.
        token_chunk_size: prefill only: tokens of each sequence this step computes (a
            chunk of a chunked prefill); None: every token past ``computed_lens``.
        guided_bitmasks: structured outputs: the step's token-bitmask source for the
            group's constrained sequences (``seq_id in masks``; a
            vllm/model_executor/guided_decoding/step_masks.py StepMasks, filled when the
            sampler reads it, or its PackedMasks after a trip to another process); set by
            the engine after scheduling. None: no sequence of the group is constrained.
        lora_request: the group's LoRA adapter (vllm.lora.request.LoRARequest), or None.
    """

    request_id: str
    is_prompt: bool
    seq_data: dict[int, SequenceData]
    sampling_params: SamplingParams
    block_tables: dict[int, list[int]]
    do_sample: bool = True
    computed_lens: dict[int, int] | None = None
    token_chunk_size: int | None = None
    guided_bitmasks: Any = None
    lora_request: Any = None


@dataclass
class ExecuteModelRequest:
    """One step's work for the executor.

    Attributes:
        seq_group_metadata_list: the scheduled groups: prefills (whole prompts or chunks)
            first, then decode rows; mixed only with chunked prefill.
        virtual_engine: index of the virtual engine (KV-cache slice and graph set) to use.
        num_lookahead_slots: extra KV slots reserved per sequence (speculative decoding).
        running_queue_size: number of running groups in that virtual engine.
        finished_requests_ids: requests finished since the previous step (proposer state).
        num_steps: decode forward passes of this call under pipeline parallelism with
            multi-step decoding, decided by the engine so every stage runs the same
            number (1 otherwise; PP = 1 decides its own, vllm/worker/multi_step.py).
        async_callback: the in-process worker calls it once the step's device work is
            launched and before it waits for the results, so the engine finishes the
            previous step's outputs meanwhile (``use_async_output_proc``); None otherwise.
            Never sent to another process.
    """

    seq_group_metadata_list: list[SequenceGroupMetadata]
    virtual_engine: int = 0
    num_lookahead_slots: int = 0
    running_queue_size: int = 0
    finished_requests_ids: list[str] = field(default_factory=list)
    num_steps: int = 1
    async_callback: Callable[[], None] | None = None


class SequenceOutput:
    """The tokens one step sampled for one sequence, with their positions' logprobs.

    Usually one token; a speculative or multi-step decode call emits several, appended by
    the engine in order with stop checks (nothing after a stop is kept).

    Two ways to build one: ``SequenceOutput(seq_id, token, logprobs, extra_tokens)`` from
    (token id, {id: Logprob}) pairs, or :meth:`from_columns` from plain lists, which
    builds the per-position dicts only if something reads them (a request without
    logprobs never does: the engine appends ``token_ids`` and ``token_logprobs``).

    Attributes:
        parent_seq_id: the sequence the tokens belong to.
        token_ids: every token of the step, in order (``output_token`` first).
        token_logprobs: each token's own logprob (0.0 where its position's dict lacks
            the token), natural log.
    """

    __slots__ = ("parent_seq_id", "token_ids", "token_logprobs", "_ranks", "_positions")

    def __init__(
        self,
        parent_seq_id: int,
        output_token: int,
        logprobs: PositionLogprobs,
        extra_tokens: list[tuple[int, PositionLogprobs]] | None = None,
    ):
        pairs = [(output_token, logprobs), *(extra_tokens or ())]
        self.parent_seq_id = parent_seq_id
        self.token_ids: list[int] = [t for t, _ in pairs]
        self.token_logprobs: list[float] = [p[t].logprob if t in p else 0.0 for t, p in pairs]
        self._ranks: list[int] | None = None
        self._positions: list[PositionLogprobs] | None = [p for _, p in pairs]

    @classmethod
    def from_columns(
        cls,
        parent_seq_id: int,
        token_ids: list[int],
        token_logprobs: list[float],
        ranks: list[int],
        positions: list[PositionLogprobs] | None = None,
    ) -> SequenceOutput:
        """One sequence's tokens as equal-length lists (at least one token): ids, their
        logprobs, their ranks (1 = most likely). ``positions``: each position's dict
        when it holds more than the chosen token (top logprobs); else built on first
        read as ``{id: Logprob(logprob, rank)}``."""
        out = cls.__new__(cls)
        out.parent_seq_id = parent_seq_id
        out.token_ids = token_ids
        out.token_logprobs = token_logprobs
        out._ranks = ranks
        out._positions = positions
        return out

    @property
    def positions(self) -> list[PositionLogprobs]:
        """Each token's position logprobs: {token id: Logprob}, one dict per token."""
        if self._positions is None:
            cols = zip(self.token_ids, self.token_logprobs, self._ranks)
            self._positions = [{t: Logprob(lp, r)} for t, lp, r in cols]
        return self._positions

    @property
    def output_token(self) -> int:
        """The step's first token."""
        return self.token_ids[0]

    @property
    def logprobs(self) -> PositionLogprobs:
        """The first token's position logprobs."""
        return self.positions[0]

    @property
    def extra_tokens(self) -> list[tuple[int, PositionLogprobs]] | None:
        """The (token id, logprobs) pairs after ``output_token``; None for one token."""
        if len(self.token_ids) == 1:
            return None
        return list(zip(self.token_ids[1:], self.positions[1:]))

    def __repr__(self) -> str:
        return f"SequenceOutput(parent_seq_id={self.parent_seq_id}, token_ids={self.token_ids})"


@dataclass
class CompletionSequenceGroupOutput:
    """The sampled tokens of one group in one step (one per scheduled sequence)."""

    samples: list[SequenceOutput]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    pooled: Any = None  # an embedding engine's vector of the group's prompt (vllm/pooling)


@dataclass
class SamplerOutput:
    """The result of one step: one entry per scheduled group, in scheduling order.

    ``sampled_token_ids`` may hold the device tensor of sampled ids for reuse by a proposer.
    """

    outputs: list[CompletionSequenceGroupOutput]
    sampled_token_ids: Any = None

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, i: int) -> CompletionSequenceGroupOutput:
        return self.outputs[i]


class IntermediateTensors:
    """Hidden states passed between pipeline stages: name -> tensor [num_tokens, hidden].

    Holds ``"hidden_states"`` and ``"residual"`` for Llama/Qwen2 stages.
    """

    def __init__(self, tensors: dict[str, Any]):
        self.tensors = tensors

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.tensors[key] = value

    def items(self):
        return self.tensors.items()

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"IntermediateTensors(keys={list(self.tensors)})"
