"""The data passed between proposer, scorer and rejection sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SpeculativeProposals:
    """Proposed tokens of one decode step, one row per scheduled sequence.

    Attributes:
        token_ids: [B, k] int64; entries at and after ``lens[b]`` are padding (0).
        probs: [B, k, V] float32 draft distributions the tokens were drawn from, or None for
            deterministic proposals (n-gram): the rejection sampler then treats q as one-hot.
        lens: [B] int64 proposal length per sequence (0..k; 0 = decode normally).
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None
    lens: torch.Tensor

    @property
    def num_proposed(self) -> int:
        return int(self.lens.sum())


@dataclass
class SpeculativeScores:
    """The target's view of every expanded row, laid out [B, k + 1] (row j of sequence b is
    the distribution of the token after the context plus proposals[:j]).

    Attributes:
        argmax: [B, k+1] int64 greedy choice (after penalties and min_tokens masking).
        probs: [B, k+1, V] float32 sampling distribution (temperature, top-k/p, min-p), or
            None when every row is greedy.
        logprobs: [B, k+1, V] float32 log-softmax of the penalized logits (what the normal
            sampler reports).
        generators: per sequence, its seeded torch.Generator or None.
        greedy: [B] bool.
    """

    argmax: torch.Tensor
    probs: torch.Tensor | None
    logprobs: torch.Tensor
    generators: list
    greedy: torch.Tensor
