"""A pipeline's last stage replies with packed sample rows, not Python objects.

A :class:`~vllm.sequence.SamplerOutput` holds one ``SequenceOutput`` per sequence and
step, each with a logprobs dict: thousands of small objects per step at a batch of 256,
or per multi-step call. Pickling them on the last stage and unpickling them in the engine
cost more than building them. The last stage instead replies with
:class:`PackedSamples`: the step's packed rows as one float64 array (what
``Sampler.sample_on_device`` produced: [token id, logprob, rank, top-k logprobs, top-k
ids] per row), the group layout (per group its sequence ids, ``logprobs`` n and
do_sample) and prompt logprobs when some group asked for them. The executor turns it into
the SamplerOutput the engine expects (:func:`unpack_outputs`) on the engine side, so a
reply is a few buffers however large the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.model_executor.layers.sampler import sample_layout, unpack_samples
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import PositionLogprobs, SamplerOutput


@dataclass
class PackedSamples:
    """One call's samples as packed rows (see the module doc).

    Attributes:
        rows: [num_steps, num_samples, 3 + 2k] float64 (one step, or a multi-step call's).
        k: the top-logprobs width of the rows.
        layout: per group, (sequence ids in row order, logprobs n, do_sample).
        prompt_logprobs: per group index, its prompt logprobs (empty when none asked).
    """

    rows: np.ndarray
    k: int
    layout: list[tuple[list[int], int, bool]]
    prompt_logprobs: dict[int, list[PositionLogprobs | None]]

    @classmethod
    def from_steps(
        cls,
        sm: SamplingMetadata,
        packed: list[torch.Tensor],
        k: int,
        prompt_lp: dict[int, list[PositionLogprobs | None]] | None = None,
    ) -> PackedSamples:
        """Pack the per-step rows ``packed`` (each [num_samples, 3 + 2k] float64, on any
        device: this is the call's one device-to-host read)."""
        rows = torch.stack(packed).cpu().numpy()  # [num_steps, num_samples, 3 + 2k]
        return cls(rows, k, sample_layout(sm), prompt_lp or {})

    def unpack(self) -> SamplerOutput:
        """The SamplerOutput the stage would have built (no device ids attached)."""
        return unpack_samples(self.layout, self.rows, self.k, self.prompt_logprobs)


def unpack_outputs(payload: Any) -> Any:
    """A stage reply with every :class:`PackedSamples` (alone or in a round's list) turned
    into its SamplerOutput; anything else unchanged."""
    if isinstance(payload, PackedSamples):
        return payload.unpack()
    if isinstance(payload, list):
        return [p.unpack() if isinstance(p, PackedSamples) else p for p in payload]
    return payload
