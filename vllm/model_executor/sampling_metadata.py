"""SamplingMetadata: which logits rows belong to which sequence, and how to sample each.

Built on the host by the model runner from the scheduled groups, then moved to the device
once per step (host-to-device copies only, no device-to-host sync). One *row* is one
position whose logits are computed: the last token of each sequence (and every prompt
position when prompt_logprobs is asked for on a first prefill).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.bad_words import banned_tokens
from vllm.model_executor.guided_decoding.step_masks import PendingBitmask
from vllm.model_executor.request_rows import CACHE_ATTR, RequestRows, request_rows
from vllm.sampling_params import LOGPROBS_MODES, SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.utils import to_device

_MASK64 = (1 << 64) - 1
_STREAM_MIX = 0x9E3779B97F4A7C15  # an odd 64-bit constant: 2^64 / the golden ratio


def stream_seed(seed: int, stream: int) -> int:
    """The generator seed of a sequence's ``seed`` in random stream ``stream``.

    Stream 0 (the runner that samples the output) uses ``seed`` itself. Any other stream
    (a draft model's runner) uses ``seed`` XOR a multiple of _STREAM_MIX (a value in
    [0, 2^64), which torch.Generator.manual_seed takes), so the two runners that sample for
    one seeded sequence draw unrelated noise: with equal seeds the draft would replay the
    target's earlier draws and propose the tokens the target had just sampled, and the
    rejection sampler's output would no longer follow the target's distribution.
    """
    if stream == 0:
        return seed
    return (seed & _MASK64) ^ ((_STREAM_MIX * stream) & _MASK64)


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
        do_sample: False for a prefill chunk that is not its prompt's last (chunked
            prefill): the group has no sample rows this step.
        prompt_start: the prompt position of the first prompt row (the chunk's start; 0
            for a whole prompt).
    """

    seq_ids: list[int]
    params: SamplingParams
    sample_rows: list[int]
    prompt_rows: list[int] = field(default_factory=list)
    prompt_token_ids: tuple[int, ...] = ()
    do_sample: bool = True
    prompt_start: int = 0


@dataclass
class PenaltyTensors:
    """Device tensors for penalties and min_tokens, one row per sample row.

    Attributes:
        prompt_tokens: [num_samples, max_prompt_len] int64, padded with ``vocab_size``.
        output_tokens: [num_samples, max_output_len] int64, padded with ``vocab_size``.
        presence, frequency, repetition: [num_samples] float32 (0, 0, 1 = no penalty).
        min_tokens_mask: [num_samples, vocab_size] bool, True for stop tokens (EOS and
            stop_token_ids) of rows that have not yet generated min_tokens tokens; None
            when no row needs it.
    """

    prompt_tokens: torch.Tensor
    output_tokens: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    min_tokens_mask: torch.Tensor | None = None


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
            for "off"; temperature 1 for greedy rows) — present when not all_greedy.
        greedy_mask: [num_samples] bool — present when not all_greedy.
        need_filter: some random row uses top-k, top-p or min-p (else the sampler skips
            the sort and samples from the tempered softmax directly).
        generators: per sample row, the row's own torch.Generator (seeded requests) or None
            (the row draws from the global generator).
        penalties: present when some row has a penalty or an active min_tokens.
        logit_bias: [num_samples, vocab] float32 added to the sample rows' logits before
            penalties: each row's ``logit_bias`` values, -inf outside its
            ``allowed_token_ids``, 0 elsewhere; present when some row has either.
        max_logprobs: largest ``logprobs`` k of any group (0 when none).
        prompt_row_ids: [num_prompt_rows] int64 rows of all groups' prompt positions.
        prompt_targets: [num_prompt_rows] int64 the token each prompt row predicts.
        max_prompt_logprobs: largest ``prompt_logprobs`` k of any group.
        guided_rows: [k] int64 sample rows under a structured-output constraint, and
        guided_bitmask: their packed allowed-token bitmasks, [k, ceil(vocab / 32)] int32
            from ``guided_bitmask.tensor()``, filled on the first read
            (vllm/model_executor/guided_decoding/step_masks.py); both None when no row is
            constrained.
        logprobs_mode: what the sample rows' logprobs report (the engine's
            ``logprobs_mode``, one of :data:`vllm.sampling_params.LOGPROBS_MODES`; see
            :func:`vllm.model_executor.layers.sampler.reported_logprobs`).
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
    need_filter: bool = False
    generators: list[torch.Generator | None] = field(default_factory=list)
    penalties: PenaltyTensors | None = None
    logit_bias: torch.Tensor | None = None
    max_logprobs: int = 0
    prompt_row_ids: torch.Tensor | None = None
    prompt_targets: torch.Tensor | None = None
    max_prompt_logprobs: int = 0
    guided_rows: torch.Tensor | None = None
    guided_bitmask: PendingBitmask | None = None
    logprobs_mode: str = LOGPROBS_MODES[0]

    @property
    def num_samples(self) -> int:
        return sum(len(g.sample_rows) for g in self.groups)

    @property
    def edits_logits(self) -> bool:
        """Some sample row's logits are edited before temperature: logit_bias /
        allowed_token_ids / bad_words, penalties or min_tokens, or a structured-output
        bitmask (else the processed logits of a greedy row are the model's own)."""
        return (
            self.logit_bias is not None
            or self.penalties is not None
            or self.guided_rows is not None
        )

    @staticmethod
    def build(
        metadata_list: list[SequenceGroupMetadata],
        query_lens: list[int],
        vocab_size: int,
        device: torch.device,
        generators: dict[int, torch.Generator],
        seed_stream: int = 0,
        logprobs_mode: str = LOGPROBS_MODES[0],
    ) -> SamplingMetadata:
        """Lay out rows for the scheduled groups.

        Per row this does only the layout (logits row, sample row, generator); the
        per-request values (temperature, filters, penalties, stop tokens) come from
        :func:`~vllm.model_executor.request_rows.request_rows`, computed once per request,
        and per-row vectors are built only when some row needs them (all-greedy rows
        without penalties, min_tokens or logprobs need none).

        Args:
            metadata_list: scheduled groups; their sequences occupy consecutive token spans
                of lengths ``query_lens`` (one entry per sequence, in order).
            query_lens: tokens fed per sequence this step.
            vocab_size: the logits' width (top_k "off" is encoded as vocab_size).
            device: where the tensors go.
            generators: seq_id -> generator store owned by the model runner. A seeded
                sequence seen for the first time (its first prefill, where every sequence
                of the group is scheduled) gets a generator seeded with
                ``seed + index of the sequence in its group``, so the n sequences of a
                seeded request differ from each other yet each is reproducible. The
                generator lives until the sequence is freed, so preemption (recompute)
                continues the same random stream.
            seed_stream: which random stream the runner draws (:func:`stream_seed`): 0 for
                the model that samples the output, another for a draft model.
            logprobs_mode: the engine's ``logprobs_mode`` (ModelConfig).
        """
        groups: list[SeqGroupRows] = []
        selected: list[int] = []
        row_reqs: list[RequestRows] = []  # per sample row
        row_data: list[SequenceData] = []  # per sample row
        seeded: list[tuple[int, int, int, int]] = []  # (row, seq_id, index in group, seed)
        prompt_rows: list[int] = []
        prompt_targets: list[int] = []
        all_greedy, any_pen, any_min_tokens, need_filter = True, False, False, False
        any_bias = False
        max_logprobs = max_prompt_logprobs = 0
        token_pos = 0
        span = 0
        guided: list[tuple[int, Any, int]] = []  # (sample row, mask source, seq_id)
        for md in metadata_list:
            masks = md.guided_bitmasks
            p = md.sampling_params
            req = p.__dict__.get(CACHE_ATTR)
            if req is None or req.vocab_size != vocab_size:
                req = request_rows(p, vocab_size)
            if not req.plain:
                all_greedy = all_greedy and req.greedy
                need_filter = need_filter or req.filtered
                any_pen = any_pen or req.penalized
                any_min_tokens = any_min_tokens or bool(req.min_tokens_stops)
                any_bias = any_bias or req.biased
                max_logprobs = max(max_logprobs, req.logprobs)
                max_prompt_logprobs = max(max_prompt_logprobs, req.prompt_logprobs)
            seq_data = md.seq_data
            do_sample = md.do_sample
            rows = SeqGroupRows(list(seq_data), p, [], do_sample=do_sample)
            want_prompt_rows = md.is_prompt and p.prompt_logprobs is not None
            idx = 0
            for seq_id, data in seq_data.items():
                qlen = query_lens[span]
                span += 1
                if want_prompt_rows and idx == 0 and not data.output_token_ids:
                    rows.prompt_token_ids = data.prompt_token_ids
                    # A chunk's rows predict the prompt tokens after each of its positions
                    # (the last chunk's last position is the sample row instead).
                    start = md.computed_lens.get(seq_id, 0) if md.computed_lens else 0
                    rows.prompt_start = start
                    for t in range(qlen - 1 if do_sample else qlen):
                        rows.prompt_rows.append(len(selected))
                        prompt_rows.append(len(selected))
                        prompt_targets.append(data.prompt_token_ids[start + t + 1])
                        selected.append(token_pos + t)
                token_pos += qlen
                if not do_sample:
                    idx += 1
                    continue
                if req.seeded:
                    seeded.append((len(row_reqs), seq_id, idx, p.seed))
                if masks is not None and seq_id in masks:
                    guided.append((len(row_reqs), masks, seq_id))
                rows.sample_rows.append(len(selected))
                selected.append(token_pos - 1)
                row_reqs.append(req)
                row_data.append(data)
                idx += 1
            groups.append(rows)
        num_samples = len(row_reqs)
        gens: list[torch.Generator | None] = [None] * num_samples
        for row, seq_id, idx, seed in seeded:
            g = generators.get(seq_id)
            if g is None:
                g = torch.Generator(device=device)
                g.manual_seed(stream_seed(seed + idx, seed_stream))
                generators[seq_id] = g
            gens[row] = g
        long = dict(dtype=torch.long)
        if prompt_rows:
            sample_rows = [r for g in groups for r in g.sample_rows]
            sample_row_ids = torch.tensor(sample_rows, **long)
            selected_ids = torch.tensor(selected, **long)
        else:  # sample row i is logits row i
            sample_row_ids = torch.arange(num_samples, **long)
            # decode (one token per sequence): row i is token i
            single = token_pos == num_samples
            selected_ids = sample_row_ids.clone() if single else torch.tensor(selected, **long)
        sm = SamplingMetadata(
            groups=groups,
            selected_token_indices=to_device(selected_ids, device),
            sample_row_ids=to_device(sample_row_ids, device),
            all_greedy=all_greedy,
            generators=gens,
            max_logprobs=max_logprobs,
            max_prompt_logprobs=max_prompt_logprobs,
            logprobs_mode=logprobs_mode,
        )
        if prompt_rows:
            sm.prompt_row_ids = to_device(torch.tensor(prompt_rows, **long), device)
            sm.prompt_targets = to_device(torch.tensor(prompt_targets, **long), device)
        min_tok_rows: list[list[int]] = []
        if any_min_tokens:
            min_tok_rows = [
                r.min_tokens_stops if len(d.output_token_ids) < r.min_tokens else []
                for r, d in zip(row_reqs, row_data)
            ]
        if num_samples and (any_pen or any(min_tok_rows)):  # no rows: a step of partial chunks
            sm.penalties = _penalty_tensors(
                [d.prompt_token_ids for d in row_data],
                [d.output_token_ids for d in row_data],
                [r.penalties for r in row_reqs],
                min_tok_rows or [[] for _ in row_reqs],
                vocab_size,
                device,
            )
        if any_bias:
            sm.logit_bias = _bias_rows(row_reqs, row_data, vocab_size, device)
        if guided:  # filled when the sampler reads it (see guided_decoding/step_masks.py)
            sm.guided_bitmask = PendingBitmask([(m, s) for _, m, s in guided], vocab_size, device)
            sm.guided_rows = to_device(torch.tensor([r for r, _, _ in guided], **long), device)
        if not all_greedy:
            sm.need_filter = need_filter
            f32 = dict(dtype=torch.float32)
            sm.greedy_mask = to_device(
                torch.tensor([r.greedy for r in row_reqs], dtype=torch.bool), device
            )
            sm.temperature = to_device(
                torch.tensor([r.temperature for r in row_reqs], **f32), device
            )
            sm.top_p = to_device(torch.tensor([r.top_p for r in row_reqs], **f32), device)
            sm.top_k = to_device(torch.tensor([r.top_k for r in row_reqs], **f32), device)
            sm.min_p = to_device(torch.tensor([r.min_p for r in row_reqs], **f32), device)
        return sm


def _bias_rows(
    row_reqs: list[RequestRows],
    row_data: list[SequenceData],
    vocab_size: int,
    device: torch.device,
) -> torch.Tensor:
    """[num_samples, vocab_size] float32 additive rows on ``device``: -inf outside a row's
    allowed_token_ids (when set) and at the tokens its bad_words ban after its output so
    far (vllm/bad_words.py), plus its logit_bias values; zeros for other rows.

    Built on the device from the (row, token) entries, so only those small index lists
    are uploaded, never a vocab-wide host tensor."""
    masked: list[int] = []  # rows with allowed_token_ids
    allowed: tuple[list[int], list[int]] = ([], [])  # (row, token) allowed
    biased: tuple[list[int], list[int], list[float]] = ([], [], [])  # (row, token, bias)
    banned: tuple[list[int], list[int]] = ([], [])  # (row, token) banned by bad_words
    for row, req in enumerate(row_reqs):
        if req.bad_words:
            toks = banned_tokens(req.bad_words, row_data[row].output_token_ids)
            banned[0].extend([row] * len(toks))
            banned[1].extend(toks)
        if req.allowed_token_ids is not None:
            masked.append(row)
            allowed[0].extend([row] * len(req.allowed_token_ids))
            allowed[1].extend(req.allowed_token_ids)
        for tok, value in req.logit_bias:
            biased[0].append(row)
            biased[1].append(tok)
            biased[2].append(value)

    def upload(values, dtype=torch.long):
        return to_device(torch.tensor(values, dtype=dtype), device)

    bias = torch.zeros(len(row_reqs), vocab_size, dtype=torch.float32, device=device)
    if masked:
        bias[upload(masked)] = float("-inf")
        bias[upload(allowed[0]), upload(allowed[1])] = 0.0
    if biased[0]:
        index = (upload(biased[0]), upload(biased[1]))
        bias.index_put_(index, upload(biased[2], torch.float32), accumulate=True)
    if banned[0]:
        bias[upload(banned[0]), upload(banned[1])] = float("-inf")
    return bias  # [num_samples, vocab_size]


def _padded(rows: list, pad: int) -> torch.Tensor:
    width = max([len(r) for r in rows] + [1])
    return torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows], dtype=torch.long)


def _penalty_tensors(
    prompts: list,
    outs: list,
    pen_rows: list[tuple[float, float, float]],
    min_tok_rows: list[list[int]],
    vocab_size: int,
    device: torch.device,
) -> PenaltyTensors:
    """Pad token lists with ``vocab_size`` (a column the sampler drops) and build rows."""
    pen = torch.tensor(pen_rows, dtype=torch.float32)  # [num_samples, 3]
    mask = None
    if any(min_tok_rows):
        mask = torch.zeros(len(min_tok_rows), vocab_size, dtype=torch.bool)
        for row, ids in enumerate(min_tok_rows):
            if ids:
                mask[row, ids] = True
        mask = to_device(mask, device)
    return PenaltyTensors(
        prompt_tokens=to_device(_padded(prompts, vocab_size), device),
        output_tokens=to_device(_padded(outs, vocab_size), device),
        presence=to_device(pen[:, 0], device),
        frequency=to_device(pen[:, 1], device),
        repetition=to_device(pen[:, 2], device),
        min_tokens_mask=mask,
    )
