"""One vector per prompt from the last stage's hidden states (see vllm/pooling/config.py).

In a prefill step the rows of the flattened batch are the prompts in scheduling order; a
prompt's tokens are contiguous, and the sampling metadata's selected index of a prompt is
its last real token (a one-prompt step padded to a prefill-graph size keeps its padding
after it). A prompt whose step computes its last token (``do_sample``) is pooled: LAST
takes that token's hidden state, MEAN averages the prompt's tokens, CLS takes its first.
Values are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.pooling.config import PoolerConfig


def pool(config: PoolerConfig, hidden: torch.Tensor, batch) -> list[torch.Tensor | None]:
    """Per scheduled group, its embedding [hidden] float32 on the CPU, or None for a group
    whose prompt is not complete in this step.

    Args:
        hidden: [num_tokens, hidden] the last stage's hidden states of the step.
        batch: the step's ForwardBatch (prefill rows, one sequence per group).
    """
    sm = batch.sampling_metadata
    query_lens = batch.step.query_lens
    selected = sm.selected_token_indices.tolist()
    out: list[torch.Tensor | None] = []
    start = 0
    for row, group in enumerate(sm.groups):
        if not group.do_sample:
            out.append(None)
        else:
            last = selected[group.sample_rows[0]]
            if config.pooling_type == "LAST":
                vec = hidden[last]  # [hidden]
            elif config.pooling_type == "MEAN":
                vec = hidden[start : last + 1].float().mean(dim=0)  # [hidden]
            else:  # CLS
                vec = hidden[start]  # [hidden]
            vec = vec.float()
            if config.normalize:
                vec = F.normalize(vec, p=2, dim=0)
            out.append(vec.cpu())
        start += query_lens[row]
    return out


def cut_dimensions(vec: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """``vec`` [hidden] cut to its first ``dimensions`` values (a Matryoshka embedding),
    renormalized when the pooler normalizes; unchanged for None."""
    if dimensions is None or dimensions >= vec.shape[0]:
        return vec
    vec = vec[:dimensions]  # [dimensions]
    return F.normalize(vec, p=2, dim=0) if normalize else vec
