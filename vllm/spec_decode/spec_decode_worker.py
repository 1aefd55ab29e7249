"""SpecDecodeWorker: wraps the target Worker with a proposer, the batch-expansion scorer and
the rejection sampler.

Prefill steps run the target (and the draft model's prefill); with chunked prefill a step
that holds a prefill chunk is such a step, and its decode rows get one token without
proposals (the draft catches up on their tokens in its next pass). A decode step: cap each
sequence's proposal length (ngram_proposer.proposal_len), propose, score the expanded batch
with one target forward, accept a prefix, and return one SequenceOutput per sequence whose
``extra_tokens`` carry the tokens after the first; the engine applies them one by one with
stop checks. A step with no proposals (at least speculative_disable_by_batch_size
running requests, or a sequence under a structured-output constraint) is a normal target
decode step.

With tensor parallelism (PP = 1) every rank of the stage runs a SpecDecodeWorker over its
shards: the same proposals (n-gram lookups read the same tokens; the draft model's ids are
sampled on TP rank 0 and broadcast before the next draft pass), the same scoring forward,
and TP rank 0 alone, which holds the gathered logits, accepts and returns the step; it
broadcasts the accepted counts when a draft model keeps per-sequence cache state.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from vllm.config import EngineConfig
from vllm.distributed.tp_ops import tensor_model_parallel_broadcast
from vllm.model_executor.layers.sampler import (
    _pack_logprobs,
    _position,
    reported_argmax_is_sampled,
)
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    ExecuteModelRequest,
    SamplerOutput,
    SequenceOutput,
)
from vllm.spec_decode.batch_expansion import flat_seqs, score_proposals
from vllm.spec_decode.draft_proposer import DRAFT_SEED_STREAM, DraftModelProposer
from vllm.spec_decode.metrics import SpecDecodeMetrics
from vllm.spec_decode.ngram_proposer import NGramProposer, proposal_len
from vllm.spec_decode.rejection_sampler import greedy_num_accepted, sample_expanded
from vllm.worker.worker import Worker

logger = logging.getLogger(__name__)


def draft_engine_config(config: EngineConfig) -> EngineConfig:
    """The draft worker's config: the draft model, no speculation (capture rule k = 0)."""
    spec = config.speculative_config
    sched = dataclasses.replace(
        config.scheduler_config,
        max_model_len=spec.speculative_max_model_len,
        num_lookahead_slots=0,
    )
    return dataclasses.replace(
        config,
        model_config=spec.draft_model_config,
        scheduler_config=sched,
        speculative_config=None,
    )


class SpecDecodeWorker:
    """The Worker interface (init_device .. free_sequences) with speculative decoding.

    Args:
        config: an EngineConfig whose speculative_config is set (PP = 1).
        rank, local_rank: as :class:`vllm.worker.worker.Worker`'s (the TP rank; the device
            index), for the target and the draft alike.
    """

    def __init__(self, config: EngineConfig, rank: int = 0, local_rank: int = 0):
        self.config = config
        self.rank = rank
        self.tp_size = config.parallel_config.tensor_parallel_size
        self.spec = config.speculative_config
        self.k = self.spec.num_speculative_tokens
        self.target = Worker(config, rank=rank, local_rank=local_rank)
        self.draft_worker = None
        if self.spec.is_ngram:
            self.proposer = NGramProposer(
                self.spec.ngram_prompt_lookup_max, self.spec.ngram_prompt_lookup_min
            )
        else:
            self.draft_worker = Worker(
                draft_engine_config(config), rank, local_rank, seed_stream=DRAFT_SEED_STREAM
            )
            self.proposer = DraftModelProposer(
                self.draft_worker, self.spec.speculative_max_model_len
            )
        self.metrics = SpecDecodeMetrics(self.k)

    # ------------------------------------------------------------ worker interface
    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def model_runner(self):
        return self.target.model_runner

    @property
    def cache_engines(self):
        return self.target.cache_engines

    def _workers(self) -> list[Worker]:
        return [self.target] + ([self.draft_worker] if self.draft_worker is not None else [])

    def init_device(self) -> None:
        for w in self._workers():
            w.init_device()

    def load_model(self) -> None:
        for w in self._workers():
            w.load_model()

    def determine_num_available_blocks(self) -> int:
        """Blocks per virtual engine for both caches (an override is used as is).

        The target's count already has the target's own CUDA graphs taken off. The draft's
        graphs, measured the same way (ModelRunner.estimate_graph_memory; 0 on CPU or with
        graphs off), come off next, rounded up to whole target blocks; what is left is
        split by target bytes / (target + draft bytes) per block, as each sequence holds
        the same number of blocks in both caches.

        Raises:
            ValueError: when the target has blocks but none fit for both models (with none
                for the target alone, 0 is returned and the executor refuses it).
        """
        blocks = self.target.determine_num_available_blocks()
        if (self.draft_worker is None or self.config.cache_config.num_gpu_blocks_override
                or blocks < 1):  # fmt: skip
            return blocks
        tb = self.target.get_cache_block_size_bytes()
        db = self.draft_worker.get_cache_block_size_bytes()
        draft_graphs = self.draft_worker.model_runner.estimate_graph_memory(
            self.target.num_virtual_engines
        )
        budget = blocks + 1 - -(-draft_graphs // tb)  # target blocks left for both caches
        shared = budget * tb // (tb + db) - 1
        logger.info(
            "Speculative KV cache: draft graphs (estimated) %.3f GiB; %d blocks each for "
            "target and draft",
            draft_graphs / 2**30,
            shared,
        )
        if shared < 1:
            raise ValueError(
                f"No KV-cache blocks fit for target and draft: {blocks + 1} target blocks of "
                f"{tb} bytes, less {draft_graphs} bytes of draft CUDA graphs, shared with "
                f"draft blocks of {db} bytes."
            )
        return shared

    def initialize_cache(self, num_blocks: int) -> None:
        for w in self._workers():
            w.initialize_cache(num_blocks)

    def capture_graphs(self, capturer=None) -> None:
        for w in self._workers():
            w.capture_graphs(capturer)

    def startup_summary(self) -> dict:
        """The target's start-up summary (vllm/worker/startup_summary.py: its speculative
        fields come from the config)."""
        from vllm.worker.startup_summary import stage_summary

        return stage_summary(self)

    def start_profile(self) -> None:
        """Profile the target worker (the draft runs in the same process, so its work is
        in the same trace)."""
        self.target.start_profile()

    def stop_profile(self) -> None:
        self.target.stop_profile()

    def free_sequences(self, seq_ids: list[int]) -> None:
        self.target.free_sequences(seq_ids)
        self.proposer.free(seq_ids)

    def num_proposer_states(self) -> int:
        """Per-sequence state held by the proposer and both runners (0 when idle)."""
        return self.proposer.num_tracked() + len(self.target.model_runner.generators)

    # ------------------------------------------------------------------- a step
    @torch.inference_mode()
    def execute_model(self, request: ExecuteModelRequest) -> SamplerOutput | None:
        """One step; see the module docstring."""
        mds = request.seq_group_metadata_list
        if not mds:
            return None
        ve = request.virtual_engine
        prompts = [md for md in mds if md.is_prompt]
        if prompts:  # with chunked prefill, decodes may ride along: they get one token
            out = self.target.execute_model(request)
            if self.draft_worker is not None:
                self.proposer.prefill(prompts, ve)
            return out
        seqs = flat_seqs(mds)
        limit = self.config.scheduler_config.max_model_len
        draft_limit = self.spec.speculative_max_model_len
        caps = [proposal_len(d.get_len(), self.k, limit, draft_limit) for _, _, d in seqs]
        thr = self.spec.speculative_disable_by_batch_size
        # running requests (groups) in the scheduler, as upstream counts them: a request's
        # n sequences count once, and running requests left out of this step count too
        if thr is not None and max(request.running_queue_size, len(mds)) >= thr:
            caps = [0] * len(seqs)
        if any(md.guided_bitmasks for md in mds):
            # Structured outputs: the grammar's mask of a position after a proposed token
            # is unknown to the worker, so a step with a constrained row proposes nothing.
            caps = [0] * len(seqs)
        if self.draft_worker is None:
            proposals = self.proposer.propose([d.get_token_ids() for _, _, d in seqs], caps)
            draft_probs = None
        else:
            proposals, draft_probs = self.proposer.propose(mds, caps, self.k, ve)
        if not any(proposals):
            return self.target.execute_model(request)
        return self._score_and_accept(mds, seqs, proposals, draft_probs, ve)

    def _score_and_accept(self, mds, seqs, proposals, draft_probs, ve) -> SamplerOutput:
        """Score, accept and pack a speculative step with one device-to-host transfer.

        All-greedy steps pack (argmax id, its logprob, rank, top-k) of every expanded row
        and accept on the host (an accepted proposal equals its row's argmax, so every
        emitted token is its row's argmax). Steps with sampled rows run the rejection
        sampler on the device first and pack each row's emitted token (-1 past the last
        one, packed as id 0 and skipped) with its logprob and rank.
        """
        scores = score_proposals(self.target, mds, proposals, ve)
        if scores is None:  # a TP rank other than 0: rank 0 accepts and returns the step
            self._share_accepted(None, seqs, proposals)
            return None
        sm = scores.sampling_metadata
        starts = scores.starts
        if sm.all_greedy:
            packed, kk = _pack_logprobs(
                scores.logprobs,
                scores.argmax,
                sm.max_logprobs,
                ranks_are_one=reported_argmax_is_sampled(sm),
            )  # [R, 3 + 2 * kk]
            host = packed.tolist()  # the step's one device-to-host transfer
            num_acc = greedy_num_accepted(proposals, [int(r[0]) for r in host], starts)
        else:
            greedy = [mds[gi].sampling_params.greedy for gi, _, _ in seqs]
            emitted = sample_expanded(scores, proposals, draft_probs, greedy, self.k)  # [R]
            packed, kk = _pack_logprobs(scores.logprobs, emitted.clamp(min=0), sm.max_logprobs)
            host = torch.cat([packed, emitted[:, None].double()], dim=1).tolist()
            num_acc = [
                sum(1 for r in host[starts[b] : starts[b + 1]] if r[-1] >= 0) - 1
                for b in range(len(seqs))
            ]
        self._share_accepted(num_acc, seqs, proposals)
        groups: list[list[SequenceOutput]] = [[] for _ in mds]
        for b, (gi, sid, _) in enumerate(seqs):
            n_lp = mds[gi].sampling_params.logprobs or 0
            first = starts[b]
            toks = [_position(host[r], n_lp, kk) for r in range(first, first + num_acc[b] + 1)]
            first_tok, first_lp = toks[0]
            groups[gi].append(SequenceOutput(sid, first_tok, first_lp, toks[1:] or None))
            if proposals[b]:
                self.metrics.record(1, len(proposals[b]), num_acc[b], num_acc[b] + 1)
        return SamplerOutput([CompletionSequenceGroupOutput(g) for g in groups])

    def _share_accepted(self, num_acc: list[int] | None, seqs, proposals) -> None:
        """Record each sequence's accepted count in the draft proposer (its cache's valid
        prefix); at TP > 1 the counts are TP rank 0's, broadcast (``num_acc`` is None on
        the other ranks), so every rank's draft runs the same passes next step. Nothing
        to record for the n-gram proposer."""
        if self.draft_worker is None:
            return
        if self.tp_size > 1:
            dev = self.device
            sent = None if num_acc is None else torch.tensor(num_acc, dtype=torch.long, device=dev)
            num_acc = tensor_model_parallel_broadcast(sent, (len(seqs),), torch.long, dev).tolist()
        for b, (_, sid, data) in enumerate(seqs):
            self.proposer.accepted(sid, data.get_len(), len(proposals[b]), num_acc[b])
