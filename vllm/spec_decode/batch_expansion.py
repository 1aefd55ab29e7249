"""Scoring proposals by batch expansion: a sequence with L proposals becomes L + 1
single-token decode rows; row j feeds token j of (last token, proposals...) at position
n - 1 + j and sees the context plus proposals[:j]. One forward of the normal decode path
(so the rows go through the graph gate, with max_decode_seq_len over the rows) writes the KV
of all L + 1 positions into the lookahead slots the scheduler reserved; the slots of
rejected positions are overwritten by later steps. Attention backends write a layer's new
KV before reading it, so row j sees rows < j of the same step.
"""

from __future__ import annotations

import torch

from vllm.model_executor.layers.sampler import (
    processed_sample_logits,
    reported_logprobs,
    sampling_logits,
)
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.spec_decode.interfaces import SpeculativeScores


def flat_seqs(metadata_list: list[SequenceGroupMetadata]) -> list[tuple[int, int, SequenceData]]:
    """(group index, seq_id, data) of every scheduled sequence, in row order."""
    return [(gi, sid, d) for gi, md in enumerate(metadata_list) for sid, d in md.seq_data.items()]


def rows_metadata(
    metadata_list: list[SequenceGroupMetadata], row_data: list[list[SequenceData]]
) -> list[SequenceGroupMetadata]:
    """Decode metadata with one single-sequence group per expanded row.

    Args:
        metadata_list: the scheduled (decode) groups.
        row_data: per scheduled sequence (row order of :func:`flat_seqs`), the token data of
            its expanded rows; each becomes a decode row feeding its last token.
    Returns:
        one SequenceGroupMetadata per row, sequence by sequence; each keeps the original
        seq_id (so seeded generators are found), params and block table.
    """
    out: list[SequenceGroupMetadata] = []
    for (gi, sid, _), datas in zip(flat_seqs(metadata_list), row_data):
        md = metadata_list[gi]
        params, table = md.sampling_params, {sid: md.block_tables[sid]}
        for d in datas:
            out.append(SequenceGroupMetadata(md.request_id, False, {sid: d}, params, table))
    return out


def prefix_data(prompt: tuple[int, ...], tail: list[int], length: int) -> SequenceData:
    """The first ``length`` tokens of ``prompt + tail`` as SequenceData (the prompt tuple is
    shared, not copied, when ``length`` covers it)."""
    plen = len(prompt)
    if length >= plen:
        return SequenceData(prompt, tail[: length - plen])
    return SequenceData(prompt[:length])


def row_distributions(
    logits: torch.Tensor, sm: SamplingMetadata, logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """What the normal sampler would sample from, per sample row.

    Same order as :class:`vllm.model_executor.layers.sampler.Sampler`: penalties, min_tokens
    masking, then argmax (greedy) and, when some row is random, the tempered and filtered
    probabilities; the logprobs are the values the sampler reports in the engine's
    ``logprobs_mode`` (raw or processed); every stage is the sampler's own function.

    Args:
        logits: [num_rows, V] float32 from the runner.
        logprobs: compute the reported values (the draft proposer reports none).
    Returns:
        (argmax [S] int64, probs [S, V] float32 or None when all rows are greedy,
        logprobs [S, V] float32 (:func:`reported_logprobs`) or None when not asked for).
    """
    x = processed_sample_logits(logits, sm)  # [S, V]
    z = sampling_logits(x, sm)  # [S, V] or None
    return (
        x.argmax(dim=-1),
        None if z is None else z.softmax(dim=-1),
        reported_logprobs(logits, x, z, sm) if logprobs else None,
    )


def score_proposals(
    worker,
    metadata_list: list[SequenceGroupMetadata],
    proposals: list[list[int]],
    virtual_engine: int,
) -> SpeculativeScores:
    """Run the target on the expanded batch: one forward, distributions of every row.

    Host work is the expanded metadata only (a row's data shares the sequence's prompt
    tuple); nothing is read back from the device here.

    Args:
        worker: the target :class:`vllm.worker.worker.Worker`.
        metadata_list: the scheduled decode groups.
        proposals: per sequence (row order of :func:`flat_seqs`), its proposals (L <= k).
    Returns:
        the flat per-row scores (sequence b owns L_b + 1 rows); None on a TP rank other
        than 0, which runs the forward (its shards) but holds no logits.
    """
    row_data = []
    starts = [0]
    for (_, _, data), props in zip(flat_seqs(metadata_list), proposals):
        prompt, out = data.prompt_token_ids, data.output_token_ids
        row_data.append([SequenceData(prompt, out + props[:j]) for j in range(len(props) + 1)])
        starts.append(starts[-1] + len(props) + 1)
    runner = worker.model_runner
    ce = worker.cache_engines[virtual_engine]
    batch = runner.prepare_model_input(
        rows_metadata(metadata_list, row_data), virtual_engine, ce.scratch_slot, 0
    )
    if worker.tp_size > 1:
        worker.assert_plan_agreement(batch)
    hidden = runner.forward_hidden(batch, ce.kv_caches)
    logits = runner.compute_logits(batch, hidden)  # None on a TP rank other than 0
    if logits is None:
        return None
    sm = batch.sampling_metadata
    argmax, probs, logprobs = row_distributions(logits, sm)
    return SpeculativeScores(argmax, probs, logprobs, starts, sm)
