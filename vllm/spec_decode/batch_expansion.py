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

from vllm.model_executor.layers.sampler import apply_penalties, filter_probs
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.spec_decode.interfaces import SpeculativeScores


def flat_seqs(metadata_list: list[SequenceGroupMetadata]) -> list[tuple[int, int, SequenceData]]:
    """(group index, seq_id, data) of every scheduled sequence, in row order."""
    return [(gi, sid, d) for gi, md in enumerate(metadata_list) for sid, d in md.seq_data.items()]


def expanded_metadata(
    metadata_list: list[SequenceGroupMetadata], rows: list[list[list[int]]]
) -> list[SequenceGroupMetadata]:
    """Decode metadata with one single-sequence group per expanded row.

    Args:
        metadata_list: the scheduled (decode) groups.
        rows: per scheduled sequence (row order of :func:`flat_seqs`), the full token lists
            of its expanded rows; each becomes a decode row feeding its last token.
    Returns:
        one SequenceGroupMetadata per row, sequence by sequence; each keeps the original
        seq_id (so seeded generators are found), params and block table.
    """
    out: list[SequenceGroupMetadata] = []
    for (gi, sid, data), seq_rows in zip(flat_seqs(metadata_list), rows):
        md = metadata_list[gi]
        plen = data.get_prompt_len()
        for toks in seq_rows:
            row_data = SequenceData(list(toks[:plen]), list(toks[plen:]))
            out.append(
                SequenceGroupMetadata(
                    request_id=md.request_id,
                    is_prompt=False,
                    seq_data={sid: row_data},
                    sampling_params=md.sampling_params,
                    block_tables={sid: md.block_tables[sid]},
                )
            )
    return out


def row_distributions(
    logits: torch.Tensor, sm: SamplingMetadata
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """What the normal sampler would sample from, per sample row.

    Same order as :class:`vllm.model_executor.layers.sampler.Sampler`: penalties, min_tokens
    masking, then argmax (greedy), log-softmax (reported logprobs) and, when some row is
    random, the tempered and filtered probabilities.

    Args:
        logits: [num_rows, V] float32 from the runner.
    Returns:
        (argmax [S] int64, probs [S, V] float32 or None when all rows are greedy,
        logprobs [S, V] float32).
    """
    x = logits[sm.sample_row_ids]  # [S, V]
    pen = sm.penalties
    if pen is not None:
        apply_penalties(
            x, pen.prompt_tokens, pen.output_tokens, pen.presence, pen.frequency, pen.repetition
        )
        if pen.min_tokens_mask is not None:
            x.masked_fill_(pen.min_tokens_mask, float("-inf"))
    argmax = x.argmax(dim=-1)  # [S]
    probs = None
    if not sm.all_greedy:
        if sm.need_filter:
            probs = filter_probs(x, sm.temperature, sm.top_k, sm.top_p, sm.min_p)
        else:
            probs = (x / sm.temperature[:, None]).softmax(dim=-1)  # [S, V]
    return argmax, probs, torch.log_softmax(x, dim=-1)


def score_proposals(
    worker,
    metadata_list: list[SequenceGroupMetadata],
    proposals: list[list[int]],
    k: int,
    virtual_engine: int,
) -> tuple[SpeculativeScores, SamplingMetadata]:
    """Run the target on the expanded batch and lay the distributions out as [B, k+1].

    Args:
        worker: the target :class:`vllm.worker.worker.Worker`.
        metadata_list: the scheduled decode groups.
        proposals: per sequence (row order of :func:`flat_seqs`), its proposals (L <= k).
        k: num_speculative_tokens.
    Returns:
        (scores, the expanded batch's SamplingMetadata). Rows past L + 1 are copies of row
        L (never read).
    """
    seqs = flat_seqs(metadata_list)
    rows = []
    for (_, _, data), props in zip(seqs, proposals):
        toks = data.get_token_ids()
        rows.append([toks + props[:j] for j in range(len(props) + 1)])
    expanded = expanded_metadata(metadata_list, rows)
    runner = worker.model_runner
    ce = worker.cache_engines[virtual_engine]
    batch = runner.prepare_model_input(expanded, virtual_engine, ce.scratch_slot, 0)
    hidden = runner.forward_hidden(batch, ce.kv_caches)
    sm = batch.sampling_metadata
    argmax, probs, logprobs = row_distributions(runner.compute_logits(batch, hidden), sm)
    index = []  # [B, k+1] flat row ids
    start = 0
    gens = []
    for props in proposals:
        n = len(props) + 1
        index.append([start + min(j, n - 1) for j in range(k + 1)])
        gens.append(sm.generators[start] if sm.generators else None)
        start += n
    idx = torch.tensor(index, dtype=torch.long, device=argmax.device)  # [B, k+1]
    greedy = [md.sampling_params.greedy for gi, _, _ in seqs for md in [metadata_list[gi]]]
    scores = SpeculativeScores(
        argmax=argmax[idx],  # [B, k+1]
        probs=None if probs is None else probs[idx],  # [B, k+1, V]
        logprobs=logprobs[idx],  # [B, k+1, V]
        generators=gens,
        greedy=torch.tensor(greedy, dtype=torch.bool, device=argmax.device),
    )
    return scores, sm
