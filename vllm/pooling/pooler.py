"""One vector per prompt from the last stage's hidden states (see vllm/pooling/config.py).

In a prefill step the rows of the flattened batch are the prompts in scheduling order; a
prompt's tokens are contiguous, and the sampling metadata's selected index of a prompt is
its last real token (a one-prompt step padded to a prefill-graph size keeps its padding
after it). A prompt whose step computes its last token (``do_sample``) is pooled: LAST
takes that token's hidden state, MEAN averages the prompt's tokens, CLS takes its first.
Values are computed in float32.

The worker returns each vector raw; the engine finishes it per request
(:func:`finish_vector`): cut to the request's ``dimensions``, then L2-normalized when the
request's ``normalize`` (or, when that is None, the pooler config's) asks for it, as
upstream's embedding head does. A step may so mix requests with and without normalization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.pooling.config import PoolerConfig
from vllm.pooling_params import PoolingParams


def pool(config: PoolerConfig, hidden: torch.Tensor, batch) -> list[torch.Tensor | None]:
    """Per scheduled group, its pooled vector [hidden] float32 on the CPU (not normalized:
    see :func:`finish_vector`), or None for a group whose prompt is not complete in this
    step.

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
            out.append(vec.float().cpu())
        start += query_lens[row]
    return out


def finish_vector(vec: torch.Tensor, params: PoolingParams, config: PoolerConfig) -> torch.Tensor:
    """A request's embedding from its raw pooled ``vec`` [hidden] float32: cut to its first
    ``params.dimensions`` values (a Matryoshka embedding; None: all), then L2-normalized
    when ``params.normalize`` is true, or is None and ``config.normalize`` is true."""
    if params.dimensions is not None and params.dimensions < vec.shape[0]:
        vec = vec[: params.dimensions]  # [dimensions]
    normalize = config.normalize if params.normalize is None else params.normalize
    return F.normalize(vec, p=2, dim=0) if normalize else vec
