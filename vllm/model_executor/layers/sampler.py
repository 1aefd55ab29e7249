"""The sampler: logits -> next tokens and logprobs, with one host transfer per step.

Order of operations (upstream vLLM V0's): ``logit_bias`` / ``allowed_token_ids`` added to
the raw logits (upstream's logits processors), penalties (repetition, then frequency, then
presence), min_tokens masking of stop tokens, then for random rows temperature, top-k, top-p
and min-p filtering. What the sample rows' logprobs report is the engine's
``logprobs_mode`` (upstream V1's option and semantics; :func:`reported_logprobs`): "raw"
takes the model's logits before any of those edits, "processed" the logits each row is drawn
from (a random row's tempered and -inf for filtered tokens, a greedy row's edited logits at
temperature 1 without its filters, so its values do not depend on the batch); "_logprobs"
reports their log_softmax (float32), "_logits" the values themselves. Prompt logprobs are
raw logprobs in every mode. Random rows are sampled by the exponential race:
``argmax(probs / q)`` with ``q ~ Exp(1)`` i.i.d. picks index i with probability probs[i]
(the Gumbel-max trick in another form, since ``-log q`` is Gumbel). Seeded rows draw their
q from their own generator, after the batch-wide draw, so their tokens depend only on their
own logits and generator state, never on the other rows of the batch. The only
device-to-host transfers are the final copies of the packed results (one for sampled
tokens, one for prompt logprobs when asked).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vllm.kernels.dispatch import get_triton_greedy
from vllm.model_executor.guided_decoding.bitmask import apply_token_bitmask
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    Logprob,
    PositionLogprobs,
    SamplerOutput,
    SequenceOutput,
)


def token_counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Occurrences per token id; tokens [rows, width] int64 padded with ``vocab``.

    Returns [rows, vocab] float32 counts (the padding column is dropped).
    """
    counts = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=torch.float32))
    return counts[:, :vocab]  # [rows, vocab]


def apply_penalties(
    logits: torch.Tensor,
    prompt_tokens: torch.Tensor,
    output_tokens: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Apply the three penalties in place and return ``logits``.

    Definitions (as upstream vLLM):
    - repetition (CTRL, arXiv:1909.05858), over tokens seen in the prompt *or* the output:
      ``l / r`` where ``l > 0``, else ``l * r``;
    - frequency (OpenAI API): ``l -= f * count_in_output``;
    - presence (OpenAI API): ``l -= p * (count_in_output > 0)``.
    Frequency and presence look at generated tokens only.

    Args:
        logits: [rows, vocab] float32.
        prompt_tokens, output_tokens: [rows, width] int64 padded with ``vocab``.
        presence, frequency, repetition: [rows] float32.
    """
    vocab = logits.shape[1]
    out_counts = token_counts(output_tokens, vocab)  # [rows, vocab]
    seen = (token_counts(prompt_tokens, vocab) > 0) | (out_counts > 0)  # [rows, vocab]
    rep = repetition[:, None].expand_as(logits)  # [rows, vocab]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalized, logits))
    logits -= frequency[:, None] * out_counts
    logits -= presence[:, None] * (out_counts > 0).to(logits.dtype)
    return logits


def filter_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p filters; returns the tempered logits.

    - top-k keeps the k largest logits (``top_k`` = vocab size keeps all);
    - top-p keeps the smallest prefix of the sorted distribution whose mass reaches p (a
      token is kept when the mass *before* it is below p);
    - min-p keeps tokens whose probability is at least ``min_p * max probability``;
    the most likely token always survives. Ties are broken by the sort order.

    Args:
        logits: [rows, vocab] float32; temperature, top_k (as float), top_p, min_p: [rows].
    Returns:
        [rows, vocab] float32 tempered logits (-inf for filtered tokens).
    """
    logits = logits / temperature[:, None]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [rows, vocab]
    ranks = torch.arange(logits.shape[1], device=logits.device)[None, :]  # [1, vocab]
    drop = ranks >= top_k[:, None]  # [rows, vocab]
    probs_sorted = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted  # [rows, vocab]
    drop |= mass_before >= top_p[:, None]
    drop |= probs_sorted < min_p[:, None] * probs_sorted[:, :1]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)  # [rows, vocab]


def sample_exponential(
    probs: torch.Tensor, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Draw one index per row with probability ``probs[row]`` (exponential race).

    Rows whose generator is None use torch's global generator (one batch-wide draw); a
    row with its own generator overwrites its noise from that generator alone.

    Args:
        probs: [rows, vocab] float32; generators: one entry per row.
    Returns:
        [rows] int64 token ids.
    """
    q = torch.empty_like(probs)  # [rows, vocab]
    q.exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            q[row].exponential_(generator=gen)
    q.clamp_(min=torch.finfo(q.dtype).tiny)  # an exact 0 draw would give inf/nan
    return (probs / q).argmax(dim=-1)


def processed_sample_logits(logits: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor:
    """The sample rows' logits after logit_bias / allowed_token_ids, penalties, the
    structured-output token bitmask of constrained rows (-inf for tokens their grammar
    forbids) and min_tokens masking (which spares a constrained row whose grammar allows
    nothing but the stop tokens it masks). The sampler's first stage; every sampling path goes
    through it: plain and Triton greedy, multi-step, the speculative scorer, hence the
    rejection sampler's target probabilities, and the draft proposer.

    When every row is a sample row, in order (decode, or prefill without prompt logprobs),
    no gather is made, and ``logits`` is copied only when the bias or penalties edit it.

    Args:
        logits: [num_rows, vocab] float32 (or 16-bit: widened to float32 first when
            something edits them), rows laid out by ``sm``.
    Returns:
        [num_samples, vocab] (``logits`` itself when nothing edits it; float32 when
        something does).
    """
    pen = sm.penalties
    bias = sm.logit_bias  # [num_samples, vocab] or None
    if logits.dtype != torch.float32 and sm.edits_logits:
        logits = logits.float()  # [num_rows, vocab]
    x = sample_rows(logits, sm)  # [num_samples, vocab]
    if x is logits and bias is None and sm.edits_logits:
        x = logits.clone()  # adding the bias makes a new tensor; the rest edits in place
    if bias is not None:
        x = x + bias  # [num_samples, vocab]
    if pen is not None:
        apply_penalties(
            x, pen.prompt_tokens, pen.output_tokens, pen.presence, pen.frequency, pen.repetition
        )
    if sm.guided_rows is not None:
        apply_token_bitmask(x, sm.guided_rows, sm.guided_bitmask.tensor())
    if pen is not None and pen.min_tokens_mask is not None:
        mask = pen.min_tokens_mask  # [num_samples, vocab] bool
        if sm.guided_rows is not None:
            # A grammar that is complete allows only the end of sequence: min_tokens
            # yields to it rather than leave a row with nothing to sample (the stop
            # checker ends such a sequence at that token, vllm/engine/stop_checker.py).
            left = x.masked_fill(mask, float("-inf")).amax(dim=-1, keepdim=True)  # [num_samples, 1]
            mask = mask & (left > float("-inf"))  # [num_samples, vocab]
        x.masked_fill_(mask, float("-inf"))
    return x


def sample_rows(logits: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor:
    """The sample rows of ``logits`` ([num_rows, vocab]): ``logits`` itself when every row
    is a sample row, in order (decode, or prefill without prompt logprobs), else a gather
    (a copy). Returns [num_samples, vocab]."""
    if sm.prompt_row_ids is None and sm.sample_row_ids.shape[0] == logits.shape[0]:
        return logits
    return logits[sm.sample_row_ids]  # [num_samples, vocab]


def sampling_logits(x: torch.Tensor, sm: SamplingMetadata) -> torch.Tensor | None:
    """The logits the random rows are drawn from: tempered, then filtered by top-k / top-p /
    min-p when some row uses one (else no sort). Greedy rows have temperature 1.

    Args:
        x: [num_samples, vocab] float32 from :func:`processed_sample_logits`.
    Returns:
        [num_samples, vocab] float32 (-inf for filtered tokens), or None when every row is
        greedy.
    """
    if sm.all_greedy:
        return None
    if sm.need_filter:
        return filter_logits(x, sm.temperature, sm.top_k, sm.top_p, sm.min_p)
    return x / sm.temperature[:, None]  # [num_samples, vocab]


def logprob_values(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """The values ``logits`` ([rows, vocab]) report under ``mode``: their log_softmax for a
    "_logprobs" mode, the logits themselves for a "_logits" one; [rows, vocab] float32.
    Every reported logprob goes through here (sample rows by :func:`reported_logprobs`,
    prompt rows by :func:`prompt_logprobs`); only the CUDA greedy kernel
    (vllm/kernels/greedy.py) computes the same log_softmax value in its own fused way."""
    logits = logits.float()  # no copy when already float32
    if mode.endswith("_logits"):
        return logits
    return torch.log_softmax(logits, dim=-1)  # [rows, vocab]


def reported_logprobs(
    logits: torch.Tensor, x: torch.Tensor, z: torch.Tensor | None, sm: SamplingMetadata
) -> torch.Tensor:
    """The values the sample rows report as logprobs, by ``sm.logprobs_mode``:

    - raw_logprobs / raw_logits: from the model's logits, before logit_bias,
      allowed_token_ids, bad_words, penalties, min_tokens and the structured-output
      bitmask (their effect on the sampled token is not seen in the values);
    - processed_logprobs / processed_logits: from the logits each row is drawn from, ``z``
      for a random row (tempered; -inf for a token its top-k / top-p / min-p filter
      drops), the edited logits ``x`` for a greedy row (temperature 1; its own filters
      are not applied, so its values do not depend on the rest of the batch).

    Args:
        logits: [num_rows, vocab] the runner's logits, as :func:`processed_sample_logits`
            got them (it edits a copy, never these).
        x: [num_samples, vocab] float32 from :func:`processed_sample_logits`.
        z: [num_samples, vocab] float32 from :func:`sampling_logits`, or None (all greedy).
    Returns:
        [num_samples, vocab] float32 (:func:`logprob_values`).
    """
    mode = sm.logprobs_mode
    if mode.startswith("raw_"):
        src = sample_rows(logits, sm) if sm.edits_logits else x  # [num_samples, vocab]
    elif z is None:
        src = x
    elif sm.need_filter:  # a greedy row's z is x unless it set a filter: undo the filter
        src = torch.where(sm.greedy_mask[:, None], x, z)  # [num_samples, vocab]
    else:
        src = z  # a greedy row's is x (temperature 1)
    return logprob_values(src, mode)


def reported_argmax_is_sampled(sm: SamplingMetadata) -> bool:
    """Whether every sample row's sampled token is the largest of its reported values (so
    its rank is 1 without a vocab-wide compare): all rows greedy, and the values come from
    the logits the argmax was taken of (a processed mode, or nothing edits them)."""
    return sm.all_greedy and (sm.logprobs_mode.startswith("processed_") or not sm.edits_logits)


class Sampler(torch.nn.Module):
    """Turns the selected rows' logits into a :class:`SamplerOutput`."""

    def forward(
        self,
        logits: torch.Tensor,
        sm: SamplingMetadata,
        before_read: Callable[[], None] | None = None,
    ) -> SamplerOutput:
        """Sample one token per scheduled sequence.

        Args:
            logits: [num_rows, vocab] float32, rows laid out by ``sm`` (sample rows and
                prompt-logprob rows).
            before_read: called once the sampling is queued on the device and before the
                host waits for it (``ExecuteModelRequest.async_callback``).
        Returns:
            SamplerOutput with one CompletionSequenceGroupOutput per group; each sample
            carries the chosen token's logprob and rank (1 = most likely) plus the top
            ``logprobs`` entries (ranks 1..k); ``sampled_token_ids`` is the [num_samples]
            int64 device tensor.
        """
        ids, packed, k = self.sample_on_device(logits, sm)
        if before_read is not None:
            before_read()
        host = packed.cpu().numpy()  # the step's one device-to-host transfer
        return sampler_output(sm, host[None], k, prompt_logprobs(logits, sm), ids)

    @staticmethod
    def sample_on_device(
        logits: torch.Tensor, sm: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The sampling of :meth:`forward` without any device-to-host transfer (the
        multi-step decode loop reads several steps' results at once).

        An all-greedy batch without logprobs on CUDA takes :mod:`vllm.kernels.greedy` (the
        same ids; logprobs equal to float32 rounding, see there) when the reported values
        are the log_softmax of the logits it takes the argmax of (a "_logprobs" mode, and
        a processed one or nothing editing the logits); it also reads 16-bit ``logits``
        as they are (the decode-loop graph's); every other path widens them to float32
        first.

        Returns:
            (ids [num_samples] int64, packed [num_samples, 3 + 2k] float64 rows as
            :func:`_pack_logprobs` lays them out, k), all on ``logits``' device.
        """
        x = processed_sample_logits(logits, sm)  # [num_samples, vocab]
        # The kernel reports the log_softmax of the logits it takes the argmax of: right
        # when those are the reported ones and the mode reports log-probabilities.
        # (no sample rows: a prefill chunk that only computes prompt logprobs)
        ranks_are_one = reported_argmax_is_sampled(sm)
        if (
            ranks_are_one
            and sm.max_logprobs == 0
            and sm.logprobs_mode.endswith("_logprobs")
            and x.stride(-1) == 1
            and x.shape[0]
        ):
            greedy = get_triton_greedy(x)  # CUDA: two launches instead of ~8
            if greedy is not None:
                ids, packed = greedy.greedy_pack(x)  # [num_samples], [num_samples, 3]
                return ids, packed, 0
        x = x.float()  # [num_samples, vocab]; no copy when already float32
        ids = row_argmax(x)  # [num_samples]
        z = sampling_logits(x, sm)  # [num_samples, vocab] or None
        if z is not None:
            probs = z.softmax(dim=-1)  # [num_samples, vocab]
            ids = torch.where(sm.greedy_mask, ids, sample_exponential(probs, sm.generators))
        lp = reported_logprobs(logits, x, z, sm)  # [num_samples, vocab]
        packed, k = _pack_logprobs(lp, ids, sm.max_logprobs, ranks_are_one=ranks_are_one)
        return ids, packed, k


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D tensor: [rows] int64 (the first maximum of each row,
    a NaN counting as the maximum, as torch does). On the CPU, for float32 / float64,
    numpy's vectorised argmax computes it (about 10x faster than torch's over a
    vocabulary-wide row: 0.03 ms instead of 0.3-0.7 ms for [128, 2048] on one thread)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() == 2:
        return torch.from_numpy(x.numpy().argmax(axis=-1).astype(np.int64, copy=False))
    return x.argmax(dim=-1)


def sampler_output(
    sm: SamplingMetadata,
    steps: np.ndarray | torch.Tensor | list[list[list[float]]],
    k: int,
    prompt_lp: dict[int, list[PositionLogprobs | None]],
    ids: torch.Tensor | None = None,
) -> SamplerOutput:
    """Unpack host rows into a SamplerOutput.

    Args:
        steps: [num_steps, num_samples, 3 + 2k] float64 packed rows (a host array or CPU
            tensor, or nested lists): one step normally; several from a multi-step decode,
            whose tokens become each sequence's ``token_ids`` in step order, appended by
            the engine with stop checks.
        k: top-logprobs width of the packed rows.
        prompt_lp: prompt logprobs per group index (:func:`prompt_logprobs`).
        ids: the last step's sampled ids [num_samples] (device), kept for proposers.
    """
    return unpack_samples(sample_layout(sm), steps, k, prompt_lp, ids)


def sample_layout(sm: SamplingMetadata) -> list[tuple[list[int], int, bool]]:
    """Per group, (its sampled seq ids in row order, its ``logprobs`` n, do_sample): all
    :func:`unpack_samples` needs to turn packed rows into a SamplerOutput."""
    return [(g.seq_ids, g.params.logprobs or 0, g.do_sample) for g in sm.groups]


def unpack_samples(
    layout: list[tuple[list[int], int, bool]],
    steps: np.ndarray | torch.Tensor | list[list[list[float]]],
    k: int,
    prompt_lp: dict[int, list[PositionLogprobs | None]],
    ids: torch.Tensor | None = None,
) -> SamplerOutput:
    """:func:`sampler_output` over a :func:`sample_layout` (the engine unpacks a pipeline
    stage's packed reply with it, vllm/worker/packed_output.py).

    Whole columns become Python lists at once (token ids, logprobs and ranks, [rows][steps]
    each) and each row's lists become its :meth:`SequenceOutput.from_columns`: no object
    per token for a row without top logprobs; rows with top logprobs get their position
    dicts through :func:`_position`.
    """
    width = 3 + 2 * k
    a = np.asarray(steps, dtype=np.float64)
    a = a.reshape(a.shape[0] if a.ndim else 0, -1, width)  # [num_steps, num_samples, width]
    toks = a[:, :, 0].astype(np.int64).T.tolist()  # [num_samples][num_steps]
    lps = a[:, :, 1].T.tolist()  # [num_samples][num_steps]
    ranks = a[:, :, 2].astype(np.int64).T.tolist()  # [num_samples][num_steps]
    outputs: list[CompletionSequenceGroupOutput] = []
    row = 0
    for gi, (seq_ids, n, do_sample) in enumerate(layout):
        samples = []
        for seq_id in seq_ids if do_sample else ():
            # rows with top logprobs carry their dicts; the others build them if read
            pos = [_position(r, n, k)[1] for r in a[:, row].tolist()] if n else None
            samples.append(
                SequenceOutput.from_columns(seq_id, toks[row], lps[row], ranks[row], pos)
            )
            row += 1
        outputs.append(CompletionSequenceGroupOutput(samples, prompt_lp.get(gi)))
    return SamplerOutput(outputs=outputs, sampled_token_ids=ids)


def _pack_logprobs(
    logprobs: torch.Tensor, targets: torch.Tensor, k: int, ranks_are_one: bool = False
) -> tuple[torch.Tensor, int]:
    """One float64 row per position: [target id, its logprob, its rank, top-k logprobs,
    top-k ids] (ids and ranks are exact in float64).

    The rank is 1 + the number of values above the target's. ``ranks_are_one``: every
    target is its row's argmax (:func:`reported_argmax_is_sampled`), so the rank is 1
    without a vocab-wide compare.

    Args:
        logprobs: [rows, vocab] float32 reported values (:func:`logprob_values`: a
            log_softmax, one fused kernel on CUDA where torch.logsumexp would be several,
            or the logits of a "_logits" mode); targets: [rows] int64.
    """
    chosen = logprobs.gather(1, targets[:, None])  # [rows, 1]
    tgt = targets[:, None].double()  # [rows, 1]
    if ranks_are_one:
        ranks = torch.ones_like(tgt)
    else:
        ranks = ((logprobs > chosen).sum(dim=-1, keepdim=True) + 1).double()
    cols = [tgt, chosen.double(), ranks]
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=-1)  # [rows, k]
        cols += [top_lp.double(), top_ids.double()]
    return torch.cat(cols, dim=1), k


def _position(row: list[float], n: int, k: int) -> tuple[int, PositionLogprobs]:
    """Unpack one packed row into (token id, {id: Logprob}) keeping the top ``n`` of k."""
    tok = int(row[0])
    pos: PositionLogprobs = {tok: Logprob(row[1], int(row[2]))}
    for j in range(n):
        t = int(row[3 + k + j])
        if t not in pos:
            pos[t] = Logprob(row[3 + j], j + 1)
    return tok, pos


def prompt_logprobs(
    logits: torch.Tensor, sm: SamplingMetadata
) -> dict[int, list[PositionLogprobs | None]]:
    """Prompt logprobs per group index: None for position 0, then for each later prompt
    token its logprob and rank given the previous tokens, plus the top ``prompt_logprobs``
    entries. Raw model logprobs (no penalties) in every ``logprobs_mode``, as upstream.
    All groups in one transfer. A chunk that
    starts after position 0 (chunked prefill) has no None entry: its entries continue the
    earlier chunks'."""
    k = sm.max_prompt_logprobs
    host: list[list[float]] = []
    if sm.prompt_row_ids is not None:
        rows = logits[sm.prompt_row_ids]  # [num_prompt_rows, vocab]
        lp = logprob_values(rows, "raw_logprobs")  # [num_prompt_rows, vocab]
        host = _pack_logprobs(lp, sm.prompt_targets, k)[0].tolist()
    result: dict[int, list[PositionLogprobs | None]] = {}
    row = 0
    for gi, g in enumerate(sm.groups):
        if not g.prompt_token_ids:  # no prompt logprobs asked, or not a first prefill
            continue
        n = g.params.prompt_logprobs or 0
        entries: list[PositionLogprobs | None] = [None] if g.prompt_start == 0 else []
        for _ in g.prompt_rows:
            entries.append(_position(host[row], n, k)[1])
            row += 1
        result[gi] = entries
    return result
