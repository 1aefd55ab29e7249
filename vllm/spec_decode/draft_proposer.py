"""The draft-model proposer: k autoregressive steps of a smaller model with its own KV cache.

The draft has its own Worker (ModelRunner + CacheEngine with the target's number of blocks)
and uses the target's block tables, so one block manager serves both. Per sequence it keeps
``draft_len``: how many leading positions of the draft cache hold the sequence's true
tokens. A step first feeds the positions draft_len .. n-1 the draft has not seen (usually 1,
2 after a fully accepted step, more after steps without speculation) as decode rows of one
forward, then feeds one proposal per step. After the rejection sampler kept ``a`` of ``L``
proposals, positions up to n - 1 + min(a, L - 1) hold true tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from vllm.distributed.tp_ops import tensor_model_parallel_broadcast
from vllm.model_executor.layers.sampler import sample_exponential
from vllm.sequence import SequenceGroupMetadata
from vllm.spec_decode.batch_expansion import (
    flat_seqs,
    prefix_data,
    row_distributions,
    rows_metadata,
)
from vllm.utils import to_device
from vllm.worker.model_input import prefill_span

DRAFT_SEED_STREAM = 1  # the draft runner's random stream (sampling_metadata.stream_seed)


class DraftModelProposer:
    """Proposes with a draft :class:`vllm.worker.worker.Worker`.

    Args:
        worker: the draft worker (its config's speculative_config is None: capture k = 0).
            Built with ``seed_stream=DRAFT_SEED_STREAM``, so its runner's seeded generators
            do not replay the target's draws.
        draft_limit: the draft's context limit (speculative_max_model_len).
    """

    def __init__(self, worker, draft_limit: int):
        self.worker = worker
        self.draft_limit = draft_limit
        self.draft_len: dict[int, int] = {}

    def prefill(self, metadata_list: list[SequenceGroupMetadata], virtual_engine: int) -> None:
        """Run the draft over the prefill groups (or chunks), no sampling: its cache then
        holds their prompts up to the end of the chunk, or, for a prompt longer than the
        draft's limit, up to that limit. The prefix cache shares the blocks of such a prompt
        with later, shorter prompts, which read the draft's keys of those positions."""
        limit = self.draft_limit
        parts: list[SequenceGroupMetadata] = []
        tops: dict[int, int] = {}  # seq_id -> where the draft's cache now ends
        for md in metadata_list:
            # what the target's prefill rows compute (the same function feeds them)
            spans = {sid: prefill_span(md, sid, d.get_len()) for sid, d in md.seq_data.items()}
            if all(end <= limit for _, end in spans.values()):
                parts.append(md)
                tops.update((sid, end) for sid, (_, end) in spans.items())
                continue
            for sid, (done, end) in spans.items():  # each sequence up to the limit
                top = min(end, limit)
                if top <= done:
                    continue
                one = dataclasses.replace(
                    md,
                    seq_data={sid: md.seq_data[sid]},
                    block_tables={sid: md.block_tables[sid]},
                    computed_lens={sid: done} if done else None,
                    token_chunk_size=top - done,
                    do_sample=False,
                    guided_bitmasks=None,
                )
                parts.append(one)
                tops[sid] = top
        if not parts:
            return
        runner = self.worker.model_runner
        ce = self.worker.cache_engines[virtual_engine]
        batch = runner.prepare_model_input(parts, virtual_engine, ce.scratch_slot, 0)
        runner.forward_hidden(batch, ce.kv_caches)
        self.draft_len.update(tops)

    @torch.inference_mode()
    def propose(
        self,
        metadata_list: list[SequenceGroupMetadata],
        caps: list[int],
        k: int,
        virtual_engine: int,
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Draft up to ``caps[i]`` tokens per sequence (row order of ``flat_seqs``).

        Returns:
            (proposals per sequence, probs [B, k, V] float32 draft distributions, or None when
            every proposing row is greedy).
        """
        seqs = flat_seqs(metadata_list)
        caps = [c if sid in self.draft_len else 0 for (_, sid, _), c in zip(seqs, caps)]
        props: list[list[int]] = [[] for _ in seqs]
        probs_out = None
        runner = self.worker.model_runner
        ce = self.worker.cache_engines[virtual_engine]
        for step in range(max(caps, default=0)):
            active = [i for i, c in enumerate(caps) if c > step]
            rows = []
            for i in active:
                data = seqs[i][2]
                tail = data.output_token_ids + props[i]
                n = data.get_len() + len(props[i])
                first = n - 1
                if step == 0:  # catch up on the positions the draft cache lacks
                    first = min(self.draft_len[seqs[i][1]], first)
                rows.append(
                    [prefix_data(data.prompt_token_ids, tail, m + 1) for m in range(first, n)]
                )
            sub = [metadata_list[seqs[i][0]] for i in active]
            sub_md = _select(sub, [seqs[i][1] for i in active])
            expanded = rows_metadata(sub_md, rows)
            batch = runner.prepare_model_input(expanded, virtual_engine, ce.scratch_slot, 0)
            if self.worker.tp_size > 1:
                self.worker.assert_plan_agreement(batch)
            hidden = runner.forward_hidden(batch, ce.kv_caches)
            logits = runner.compute_logits(batch, hidden)  # None on a TP rank other than 0
            chosen = None
            if logits is not None:
                greedy = [int(sub[j].sampling_params.greedy) for j in range(len(active))]
                chosen, probs_out = self._choose(
                    logits, batch.sampling_metadata, rows, greedy, active, step,
                    (len(seqs), k), probs_out,
                )  # fmt: skip
            # TP rank 0's ids on every rank (the next draft pass feeds them); as is at TP = 1
            chosen = tensor_model_parallel_broadcast(
                chosen, (len(active),), torch.long, self.worker.device
            )
            for i, t in zip(active, chosen.tolist()):  # the draft step's one transfer
                props[i].append(t)
        return props, probs_out

    @staticmethod
    def _choose(logits, sm, rows, greedy, active, step, probs_shape, probs_out):
        """The draft step's ids [A] int64 (the last row of each active sequence: argmax, or a
        sample from the draft's distribution for a random row) and ``probs_out``
        [B, k, V] float32 with this step's distributions filled in (created on first use;
        None while every row is greedy)."""
        argmax, probs, _ = row_distributions(logits, sm, logprobs=False)
        last, ends = -1, []
        for r in rows:
            last += len(r)
            ends.append(last)
        # one asynchronous upload: last row of each active sequence, greedy flags, the
        # active sequences' indices
        host = torch.tensor(ends + greedy + active, dtype=torch.long)
        ends_t, greedy_t, active_t = to_device(host, argmax.device).split(len(active))
        chosen = argmax[ends_t]  # [A]
        if probs is not None:
            p = probs[ends_t]  # [A, V]
            gens = [sm.generators[e] for e in ends]
            chosen = torch.where(greedy_t.bool(), chosen, sample_exponential(p, gens))
            if probs_out is None:
                probs_out = torch.zeros(*probs_shape, p.shape[1], device=p.device)
            probs_out[active_t, step] = p
        return chosen, probs_out

    def accepted(self, seq_id: int, seq_len: int, num_proposed: int, num_accepted: int) -> None:
        """Record the draft cache's valid prefix after a step that proposed for ``seq_id``
        at length ``seq_len`` (before the step's tokens were appended)."""
        if num_proposed > 0 and seq_id in self.draft_len:
            self.draft_len[seq_id] = seq_len + min(num_accepted, num_proposed - 1)

    def free(self, seq_ids: list[int]) -> None:
        """Drop the state of finished sequences (and the draft runner's generators)."""
        for sid in seq_ids:
            self.draft_len.pop(sid, None)
        self.worker.free_sequences(seq_ids)

    def num_tracked(self) -> int:
        return len(self.draft_len) + len(self.worker.model_runner.generators)


def _select(
    metadata: list[SequenceGroupMetadata], seq_ids: list[int]
) -> list[SequenceGroupMetadata]:
    """Single-sequence views of ``metadata[i]`` restricted to ``seq_ids[i]``."""
    return [
        SequenceGroupMetadata(
            request_id=md.request_id,
            is_prompt=False,
            seq_data={sid: md.seq_data[sid]},
            sampling_params=md.sampling_params,
            block_tables={sid: md.block_tables[sid]},
        )
        for md, sid in zip(metadata, seq_ids)
    ]
