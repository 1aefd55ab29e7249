"""Engine-side guided decoding: one grammar matcher per constrained sequence.

The matchers live in the engine process, next to the sequences: after each schedule the
step's constrained matchers travel with its metadata (:mod:`.step_masks`; they fill the
next token's bitmask when the sampler reads it), and they accept the tokens the step
produced during output processing (see the package docstring for the whole life of a
request).

A request whose constraint names reasoning tags (``GuidedDecodingParams.reasoning_token_ids``,
set by a server with ``--reasoning-parser``) lets its sequences think unconstrained: a
sequence whose prompt leaves the reasoning open waits, without a mask and without grammar
steps, until it generates the end tag; its matcher takes the tokens after that tag. A
waiting sequence still makes its steps run one decode pass, as a constrained one does,
so the step that generates the end tag is the last unconstrained one. The waiting state
is the sequence's own (kept across preemption by recompute, like the matcher).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Any

from vllm.model_executor.guided_decoding.compiler import grammar_cache, import_xgrammar
from vllm.model_executor.guided_decoding.step_masks import StepMasks
from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceGroup, SequenceGroupMetadata, SequenceStatus

logger = logging.getLogger(__name__)

# Constraints whose grammar the whitespace option changes.
_JSON_KINDS = ("json", "json_object")


class GuidedDecodingManager:
    """Grammars and matchers of one engine's constrained requests.

    Args:
        tokenizer: the engine's transformers tokenizer (None: guided decoding refused).
        tokenizer_key: names the tokenizer in the grammar cache's key (its path).
        vocab_size: the model's logits width.
        eos_token_id: the token that ends a complete grammar.
        disable_any_whitespace: every JSON constraint allows no free whitespace (the
            engine's ``DecodingConfig``), whatever the request's own option says.
    """

    def __init__(
        self,
        tokenizer,
        tokenizer_key: str,
        vocab_size: int,
        eos_token_id,
        disable_any_whitespace: bool = False,
    ):
        self._tokenizer = tokenizer
        self._key = tokenizer_key
        self.vocab_size = vocab_size
        self._stop_ids = [] if eos_token_id is None else [eos_token_id]
        self._compact_json = disable_any_whitespace
        self._cache = None
        self._matchers: dict[int, object] = {}  # seq_id -> xgrammar GrammarMatcher
        self._thinking: dict[int, int] = {}  # seq_id -> end tag id, while its reasoning lasts
        self._batch = None  # xgrammar BatchGrammarMatcher, made on first use

    @property
    def cache(self):
        """The grammar cache of this tokenizer (built on first use: a few hundred ms)."""
        if self._tokenizer is None:
            raise ValueError(
                "guided decoding needs a tokenizer (the engine was started with "
                "skip_tokenizer_init=True)."
            )
        if self._cache is None:
            self._cache = grammar_cache(self._tokenizer, self._key, self.vocab_size, self._stop_ids)
        return self._cache

    def grammar_future(self, params: SamplingParams) -> Future | None:
        """Start (or find) the compilation of ``params.guided_decoding``; None without one.

        Raises:
            ValueError: the constraint does not parse (message names it).
        """
        gd = params.guided_decoding
        if gd is None:
            return None
        if self._compact_json and not gd.disable_any_whitespace and gd.kind in _JSON_KINDS:
            gd = dataclasses.replace(gd, disable_any_whitespace=True)
        return self.cache.get(gd)

    def start(self, group: SequenceGroup, compiled) -> None:
        """Give each unfinished sequence of ``group`` a matcher of ``compiled``; with
        reasoning tags and a prompt that leaves the reasoning open, the sequences wait
        for the end tag before their matchers run."""
        xgr = import_xgrammar()

        gd = group.sampling_params.guided_decoding
        thinking = not gd.reasoning_ended(group.prompt_token_ids)
        for seq in group.seqs:
            self._matchers[seq.seq_id] = xgr.GrammarMatcher(compiled)
            if thinking:
                self._thinking[seq.seq_id] = gd.reasoning_token_ids[1]

    @property
    def active(self) -> bool:
        """True while some sequence has a matcher."""
        return bool(self._matchers)

    def attach_masks(self, metadata_list: list[SequenceGroupMetadata]) -> None:
        """Set ``guided_bitmasks`` of every scheduled group: one :class:`~.step_masks.StepMasks`
        of the step's constrained sequences for the groups that have one, None for the
        others. The masks themselves are filled when the sampler first reads them (after
        the forward pass is launched), or when the step is sent to another process. A
        sequence still reasoning is in its group's masks without a row (None): its step
        runs one pass, its logits are not masked."""
        if not self._matchers:
            return
        step: dict[int, Any] = {}
        constrained: list[SequenceGroupMetadata] = []
        for md in metadata_list:
            md.guided_bitmasks = None
            found = {
                s: None if s in self._thinking else self._matchers[s]
                for s in md.seq_data
                if s in self._matchers
            }
            if found:
                step.update(found)
                constrained.append(md)
        if constrained:
            masks = StepMasks(step, self.vocab_size, self._batch_matcher())
            for md in constrained:
                md.guided_bitmasks = masks

    def _batch_matcher(self):
        """xgrammar's BatchGrammarMatcher (a thread pool filling rows in parallel)."""
        if self._batch is None:
            xgr = import_xgrammar()

            self._batch = xgr.BatchGrammarMatcher(max_threads="auto")
        return self._batch

    def accept(self, group: SequenceGroup, old_lens: dict[int, int]) -> None:
        """Advance the matchers of ``group`` by the tokens appended since ``old_lens``
        (seq_id -> output length before the step); finish a sequence whose grammar has
        terminated (finish reason "stop"). A sequence still reasoning skips the tokens up
        to and including its end tag (all of them when the tag is not among them).

        Raises:
            RuntimeError: a token the grammar does not allow (the mask should make this
                impossible; the engine fails only this request).
        """
        for seq in group.seqs:
            m = self._matchers.get(seq.seq_id)
            if m is None:
                continue
            new = seq.output_token_ids[old_lens.get(seq.seq_id, 0) :]
            end = self._thinking.get(seq.seq_id)
            if end is not None:
                if end not in new:
                    continue
                del self._thinking[seq.seq_id]
                new = new[new.index(end) + 1 :]
            for tok in new:
                if m.is_terminated():
                    break
                if not m.accept_token(tok):
                    raise RuntimeError(
                        f"token {tok} of sequence {seq.seq_id} is not allowed by the "
                        f"request's grammar ({group.sampling_params.guided_decoding.kind})."
                    )
            if m.is_terminated() and not seq.is_finished():
                seq.status = SequenceStatus.FINISHED_STOPPED

    def free(self, seq_ids) -> None:
        """Drop the matchers of finished or aborted sequences."""
        for sid in seq_ids:
            self._matchers.pop(sid, None)
            self._thinking.pop(sid, None)
