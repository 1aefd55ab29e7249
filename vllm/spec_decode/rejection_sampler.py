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
"""

from __future__ import annotations

import torch

from vllm.model_executor.layers.sampler import sample_exponential


def rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    lens: torch.Tensor,
    target_argmax: torch.Tensor,
    target_probs: torch.Tensor | None,
    greedy: torch.Tensor,
    generators: list,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the emitted tokens of one speculative step.

    Args:
        draft_token_ids: [B, k] int64 proposals (padding past ``lens``).
        draft_probs: [B, k, V] float32 draft distributions, or None (one-hot proposals).
        lens: [B] int64 proposal lengths in [0, k].
        target_argmax: [B, k+1] int64 target argmax per expanded row.
        target_probs: [B, k+1, V] float32 target distributions (None if all rows greedy).
        greedy: [B] bool.
        generators: B entries, a torch.Generator for seeded rows, else None.
    Returns:
        (tokens [B, k+1] int64 with -1 after the last emitted token, num_accepted [B] int64);
        row b emits num_accepted[b] + 1 tokens.
    Raises:
        ValueError: when a sampled row has no target_probs.
    """
    bsz, k = draft_token_ids.shape
    device = draft_token_ids.device
    pos = torch.arange(k, device=device)[None, :]  # [1, k]
    in_range = pos < lens[:, None]  # [B, k]
    accept = draft_token_ids == target_argmax[:, :k]  # [B, k] greedy rule
    final_probs = None
    if not bool(greedy.all()):
        if target_probs is None:
            raise ValueError("rejection_sample needs target_probs for sampled rows, got None.")
        p = target_probs[:, :k, :]  # [B, k, V]
        if draft_probs is None:
            q = torch.zeros_like(p).scatter_(2, draft_token_ids[:, :, None], 1.0)  # [B, k, V]
        else:
            q = draft_probs
        p_x = p.gather(2, draft_token_ids[:, :, None]).squeeze(2)  # [B, k]
        q_x = q.gather(2, draft_token_ids[:, :, None]).squeeze(2)  # [B, k]
        u = torch.rand(bsz, k, device=device)  # [B, k]
        for b, gen in enumerate(generators):
            if gen is not None:
                u[b] = torch.rand(k, device=device, generator=gen)
        sampled_accept = u * q_x < p_x  # u < p/q, i.e. accept with min(1, p/q)
        accept = torch.where(greedy[:, None], accept, sampled_accept)
    accept &= in_range
    num_acc = accept.long().cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(bsz, device=device)
    out = torch.full((bsz, k + 1), -1, dtype=torch.long, device=device)
    out[:, :k] = torch.where(pos < num_acc[:, None], draft_token_ids, -1)
    final = target_argmax[rows, num_acc]  # [B] greedy choice
    if not bool(greedy.all()):
        p_final = target_probs[rows, num_acc]  # [B, V]
        rejected = num_acc < lens  # [B] else bonus from p
        j = num_acc.clamp(max=k - 1)
        q_final = q[rows, j]  # [B, V]
        residual = (p_final - q_final).clamp(min=0)  # [B, V]
        mass = residual.sum(dim=1, keepdim=True)  # [B, 1]
        # p == q makes a rejection impossible; guard the 0/0 anyway by falling back to p.
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_final)
        final_probs = torch.where(rejected[:, None], residual, p_final)  # [B, V]
        drawn = sample_exponential(final_probs, generators)  # [B]
        final = torch.where(greedy, final, drawn)
    out[rows, num_acc] = final
    return out, num_acc
