"""SamplingMetadata: which logits rows belong to which sequence, and how to sample each.

Built on the host by the model runner from the scheduled groups, then moved to the device
once per step. One *row* is one position whose logits are computed: the last token of each
sequence (and every prompt position when prompt_logprobs is asked for).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm.sampling_params import SamplingParams
from vllm.sequence import SequenceGroupMetadata


@dataclass
class SeqGroupRows:
    """The rows of one scheduled group.

    Attributes:
        seq_ids: the group's scheduled sequences, in row order.
        params: its sampling params.
        sample_rows: per sequence, the logits row of its next-token distribution.
        prompt_rows: rows of prompt positions 0..L-2 (predicting tokens 1..L-1) when
            prompt_logprobs is set on a first prefill, else empty.
        prompt_token_ids: the prompt's ids (targets of the prompt rows are ids[1:]).
    """

    seq_ids: list[int]
    params: SamplingParams
    sample_rows: list[int]
    prompt_rows: list[int] = field(default_factory=list)
    prompt_token_ids: tuple[int, ...] = ()


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs.

    Attributes:
        groups: one entry per scheduled group, in scheduling order.
        selected_token_indices: [num_rows] int64 positions (into the flattened new tokens)
            whose hidden states go through lm_head.
        sample_row_ids: [num_samples] int64 rows that are sampled, one per sequence.
        all_greedy: no row needs randomness (argmax only).
        temperature, top_p, top_k, min_p: [num_samples] float32 (top_k as float, vocab size
            for "off") — present when not all_greedy.
        greedy_mask: [num_samples] bool.
        generators: per sample row, a torch.Generator for seeded requests, or None.
        output_token_ids / prompt_token_ids: per sample row, for penalties.
        max_logprobs: largest logprobs k asked for by any row (0 when none).
    """

    groups: list[SeqGroupRows]
    selected_token_indices: torch.Tensor
    sample_row_ids: torch.Tensor
    all_greedy: bool
    greedy_mask: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    generators: list[torch.Generator | None] = field(default_factory=list)
    output_token_ids: list[list[int]] = field(default_factory=list)
    prompt_token_ids: list[tuple[int, ...]] = field(default_factory=list)
    do_penalties: bool = False
    max_logprobs: int = 0

    @staticmethod
    def build(
        metadata_list: list[SequenceGroupMetadata],
        query_lens: list[int],
        vocab_size: int,
        device: torch.device,
        generators: dict[int, torch.Generator],
    ) -> SamplingMetadata:
        """Lay out rows for the scheduled groups.

        Args:
            metadata_list: scheduled groups; their sequences occupy consecutive token spans
                of lengths ``query_lens`` (one entry per sequence, in order).
            vocab_size: used as top_k when top-k is off.
            device: where the tensors go.
            generators: seq_id -> generator store owned by the model runner; a seeded
                sequence seen for the first time gets one seeded with
                ``seed + index of the sequence in its group``.
        """
        groups: list[SeqGroupRows] = []
        selected: list[int] = []
        sample_rows: list[int] = []
        temps, top_ps, top_ks, min_ps, greedy, gens = [], [], [], [], [], []
        outs, prompts = [], []
        token_pos = 0
        span = 0
        for md in metadata_list:
            p = md.sampling_params
            rows = SeqGroupRows(seq_ids=list(md.seq_data), params=p, sample_rows=[])
            for idx, (seq_id, data) in enumerate(md.seq_data.items()):
                qlen = query_lens[span]
                span += 1
                first_prefill = md.is_prompt and data.get_output_len() == 0
                if first_prefill and p.prompt_logprobs is not None and idx == 0:
                    rows.prompt_token_ids = data.prompt_token_ids
                    for t in range(qlen - 1):
                        rows.prompt_rows.append(len(selected))
                        selected.append(token_pos + t)
                rows.sample_rows.append(len(selected))
                sample_rows.append(len(selected))
                selected.append(token_pos + qlen - 1)
                token_pos += qlen
                temps.append(p.temperature if not p.greedy else 1.0)
                top_ps.append(p.top_p)
                top_ks.append(float(p.top_k if p.top_k > 0 else vocab_size))
                min_ps.append(p.min_p)
                greedy.append(p.greedy)
                if p.seed is not None and not p.greedy:
                    if seq_id not in generators:
                        g = torch.Generator(device=device)
                        g.manual_seed(p.seed + idx)
                        generators[seq_id] = g
                    gens.append(generators[seq_id])
                else:
                    gens.append(None)
                outs.append(data.output_token_ids)
                prompts.append(data.prompt_token_ids)
            groups.append(rows)
        all_greedy = all(greedy)
        sm = SamplingMetadata(
            groups=groups,
            selected_token_indices=torch.tensor(selected, dtype=torch.long).to(device),
            sample_row_ids=torch.tensor(sample_rows, dtype=torch.long).to(device),
            all_greedy=all_greedy,
            generators=gens,
            output_token_ids=outs,
            prompt_token_ids=prompts,
            max_logprobs=max(
                [g.params.logprobs or 0 for g in groups]
                + [g.params.prompt_logprobs or 0 for g in groups]
            ),
        )
        sm.do_penalties = any(
            g.params.presence_penalty != 0
            or g.params.frequency_penalty != 0
            or g.params.repetition_penalty != 1.0
            for g in groups
        )
        if not all_greedy:
            f32 = dict(dtype=torch.float32)
            sm.greedy_mask = torch.tensor(greedy, dtype=torch.bool).to(device)
            sm.temperature = torch.tensor(temps, **f32).to(device)
            sm.top_p = torch.tensor(top_ps, **f32).to(device)
            sm.top_k = torch.tensor(top_ks, **f32).to(device)
            sm.min_p = torch.tensor(min_ps, **f32).to(device)
        return sm
