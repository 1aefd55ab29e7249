"""Rejection sampler of speculative decoding.

Greedy rows: accept draft token j while it equals the target's argmax at j; the first
mismatch is replaced by the target's argmax; when all are accepted the target's argmax after
the last one is appended (the bonus token). The output equals greedy decoding of the target.

Sampled rows (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al. 2023): accept draft token x_j with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection sample from
norm(max(0, p_j - q_j)); when all are accepted sample the bonus from p_{L}. Each emitted
token is then distributed exactly as the target would sample it. Deterministic proposals
(n-gram) have q_j = one-hot(x_j). A seeded row draws all its randomness from its own
generator (uniforms first, then the final token).

Greedy-only steps never reach the device sampler: :func:`greedy_num_accepted` compares the
proposals with the target's argmax ids on the host, after the step's one transfer.
"""

from __future__ import annotations

import torch

from vllm.model_executor.layers.sampler import sample_exponential
from vllm.spec_decode.interfaces import SpeculativeScores
from vllm.utils import to_device


def greedy_num_accepted(
    proposals: list[list[int]], target_ids: list[int], starts: list[int]
) -> list[int]:
    """The greedy rule on the host: proposal j of sequence b is kept while it equals the
    target's argmax at row ``starts[b] + j`` (and every earlier one was kept).

    Args:
        proposals: per sequence, its proposed ids.
        target_ids: [R] argmax id per flat expanded row.
        starts: first row of each sequence.
    Returns:
        num_accepted per sequence; the emitted tokens are the argmax ids of rows
        ``starts[b] .. starts[b] + num_accepted[b]``.
    """
    result = []
    for props, s in zip(proposals, starts):
        a = 0
        for tok in props:
            if tok != target_ids[s + a]:
                break
            a += 1
        result.append(a)
    return result


def rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    lens: torch.Tensor,
    target_argmax: torch.Tensor,
    target_probs: torch.Tensor | None,
    greedy: torch.Tensor,
    generators: list,
    all_greedy: bool | None = None,
    host_lens: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the emitted tokens of one speculative step (on the device, no host reads
    when ``all_greedy`` is given).

    Args:
        draft_token_ids: [B, k] int64 proposals (padding past ``lens``).
        draft_probs: [B, k, V] float32 draft distributions, or None (one-hot proposals).
        lens: [B] int64 proposal lengths in [0, k].
        target_argmax: [B, k+1] int64 target argmax per expanded row.
        target_probs: [B, k+1, V] float32 target distributions (None if all rows greedy).
        greedy: [B] bool.
        generators: B entries, a torch.Generator for seeded rows, else None.
        all_greedy: whether every entry of ``greedy`` is True, when the caller knows it
            (None reads it from ``greedy``: one device-to-host sync).
        host_lens: ``lens`` on the host, when the caller has them: a seeded row then draws
            one uniform per proposal it has, so a row without proposals advances its
            generator only by the final draw, as a step without speculation would (its
            tokens do not depend on what was proposed for other rows); None: k uniforms
            per seeded row.
    Returns:
        (tokens [B, k+1] int64 with -1 after the last emitted token, num_accepted [B] int64);
        row b emits num_accepted[b] + 1 tokens.
    Raises:
        ValueError: when a sampled row has no target_probs.
    """
    bsz, k = draft_token_ids.shape
    device = draft_token_ids.device
    if all_greedy is None:
        all_greedy = bool(greedy.all())
    pos = torch.arange(k, device=device)[None, :]  # [1, k]
    in_range = pos < lens[:, None]  # [B, k]
    accept = draft_token_ids == target_argmax[:, :k]  # [B, k] greedy rule
    if not all_greedy:
        if target_probs is None:
            raise ValueError("rejection_sample needs target_probs for sampled rows, got None.")
        p = target_probs[:, :k, :]  # [B, k, V]
        p_x = p.gather(2, draft_token_ids[:, :, None]).squeeze(2)  # [B, k]
        u = torch.rand(bsz, k, device=device)  # [B, k]
        for b, gen in enumerate(generators):
            n = k if host_lens is None else host_lens[b]
            if gen is not None and n > 0:
                u[b, :n] = torch.rand(n, device=device, generator=gen)
        if draft_probs is None:  # one-hot q: q(x) = 1, accept with probability p(x)
            sampled_accept = u < p_x
        else:
            q_x = draft_probs.gather(2, draft_token_ids[:, :, None]).squeeze(2)  # [B, k]
            sampled_accept = u * q_x < p_x  # u < p/q, i.e. accept with min(1, p/q)
        accept = torch.where(greedy[:, None], accept, sampled_accept)
    accept &= in_range
    num_acc = accept.long().cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(bsz, device=device)
    out = torch.full((bsz, k + 1), -1, dtype=torch.long, device=device)
    out[:, :k] = torch.where(pos < num_acc[:, None], draft_token_ids, -1)
    final = target_argmax[rows, num_acc]  # [B] greedy choice
    if not all_greedy:
        p_final = target_probs[rows, num_acc]  # [B, V]
        rejected = num_acc < lens  # [B] else bonus from p
        j = num_acc.clamp(max=k - 1)
        if draft_probs is None:
            q_final = torch.zeros_like(p_final).scatter_(
                1, draft_token_ids[rows, j][:, None], 1.0
            )  # [B, V] one-hot of the rejected proposal
        else:
            q_final = draft_probs[rows, j]  # [B, V]
        residual = (p_final - q_final).clamp(min=0)  # [B, V]
        mass = residual.sum(dim=1, keepdim=True)  # [B, 1]
        # p == q makes a rejection impossible; guard the 0/0 anyway by falling back to p.
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_final)
        final_probs = torch.where(rejected[:, None], residual, p_final)  # [B, V]
        drawn = sample_exponential(final_probs, generators)  # [B]
        final = torch.where(greedy, final, drawn)
    out[rows, num_acc] = final
    return out, num_acc


def sample_expanded(
    scores: SpeculativeScores,
    proposals: list[list[int]],
    draft_probs: torch.Tensor | None,
    greedy: list[bool],
    k: int,
) -> torch.Tensor:
    """:func:`rejection_sample` over the flat expanded rows of a step with sampled rows.

    The host layout (proposals padded to [B, k], lengths, the [B, k+1] row index of each
    (sequence, position) and the flat rows' (sequence, position)) goes to the device as one
    asynchronous upload; nothing is read back.

    Args:
        scores: the target's flat scores (``probs`` set).
        proposals: per sequence, its proposals (L_b <= k).
        draft_probs: [B, k, V] float32 or None (n-gram).
        greedy: per sequence.
    Returns:
        [R] int64: per flat row, the token it emits, or -1 for rows after the last
        emitted token of their sequence.
    """
    bsz = len(proposals)
    starts = scores.starts
    r = starts[-1]
    host: list[int] = []
    for props in proposals:  # [B, k] padded proposals
        host += props + [0] * (k - len(props))
    host += [len(p) for p in proposals]  # [B] lens
    for b, props in enumerate(proposals):  # [B, k+1] flat row of (b, j); past L_b: row L_b
        last = len(props)
        host += [starts[b] + min(j, last) for j in range(k + 1)]
    host += [int(g) for g in greedy]  # [B]
    for b, props in enumerate(proposals):  # [R] flat row -> b * (k + 1) + j
        host += [b * (k + 1) + j for j in range(len(props) + 1)]
    dev = scores.argmax.device
    packed = to_device(torch.tensor(host, dtype=torch.long), dev)
    sizes = [bsz * k, bsz, bsz * (k + 1), bsz, r]
    tokens, lens, index, greedy_t, flat = packed.split(sizes)
    index = index.view(bsz, k + 1)
    gens = scores.sampling_metadata.generators
    out, _ = rejection_sample(
        tokens.view(bsz, k),
        draft_probs,
        lens,
        scores.argmax[index],  # [B, k+1]
        scores.probs[index],  # [B, k+1, V]
        greedy_t.bool(),
        [gens[s] if gens else None for s in starts[:-1]],
        all_greedy=False,
        host_lens=[len(p) for p in proposals],
    )
    return out.view(-1)[flat]  # [R]
