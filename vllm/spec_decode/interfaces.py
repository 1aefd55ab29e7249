"""The data the scorer passes to the rejection sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.model_executor.sampling_metadata import SamplingMetadata


@dataclass
class SpeculativeScores:
    """The target's view of every expanded row, flat in row order: sequence b owns rows
    ``starts[b] .. starts[b + 1] - 1``, and its row ``starts[b] + j`` is the distribution of
    the token after the context plus proposals[:j] (j = 0 .. L_b).

    Attributes:
        argmax: [R] int64 greedy choice (after penalties and min_tokens masking).
        probs: [R, V] float32 sampling distribution (temperature, top-k/p, min-p), or None
            when every row is greedy.
        logprobs: [R, V] float32 values the normal sampler would report in the engine's
            ``logprobs_mode`` (``sampler.reported_logprobs``).
        starts: B + 1 host ints, the first row of each sequence and R at the end.
        sampling_metadata: the expanded batch's metadata (``all_greedy``, ``max_logprobs``,
            per-row ``generators``: a sequence's rows share its seeded generator).
    """

    argmax: torch.Tensor
    probs: torch.Tensor | None
    logprobs: torch.Tensor
    starts: list[int]
    sampling_metadata: SamplingMetadata
