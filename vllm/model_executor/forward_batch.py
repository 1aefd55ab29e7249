"""ForwardBatch: the one typed object that carries a step from input preparation to the model.

Life of a batch: the scheduler picks sequence groups (all prefill or all decode; with
chunked prefill, prefill chunks first and then decode rows: a MIXED batch) ->
``ModelRunner.prepare_model_input`` flattens their new tokens into ``input_ids`` and
``positions``, computes each token's KV slot from the block tables, optionally pads a decode
batch to a captured size (padded lanes: token 0, position 0, slot -1 -> scratch slot) or a
one-sequence prefill to a prefill-graph size (padded tokens alike), asks
the attention backend to build device metadata, and lays out sampling rows -> the runner
replays a CUDA graph or runs the model eagerly -> logits of the selected rows -> sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.attention.backends.abstract import AttentionMetadata, ForwardMode, StepInputs
from vllm.model_executor.sampling_metadata import SamplingMetadata


@dataclass
class ForwardBatch:
    """Inputs of one forward pass.

    Attributes:
        mode: PREFILL, DECODE or MIXED (chunked prefill: prefill rows, then decode rows).
        input_ids: [num_tokens] int64 (padded lanes included); on the device for an eager
            step, in pinned host memory for a replayed one (the replay uploads it straight
            into the graph's static input buffer).
        positions: [num_tokens] int64, placed like ``input_ids``.
        attn_metadata: the backend's metadata.
        step: the host-side StepInputs the metadata was built from.
        sampling_metadata: rows to sample (None on pipeline stages that do not sample).
        virtual_engine: which VE's KV cache (and graphs) this step uses.
        num_real_rows: rows that belong to requests.
        batch_size: rows including padded lanes (the captured size when padded).
        max_decode_seq_len: longest row context in a decode step, lookahead slots
            included (for the graph gate), 0 for prefill.
        graph_size: the captured size this step replays (decode: rows; prefill: the
            token count of a prefill graph), or None when it runs eagerly (then
            ``attn_metadata`` is set).
        eager_reason: why it runs eagerly ("prefill", "enforce_eager", "too_big",
            "too_long", "mixed"), None when it replays.
        piecewise: runs as piecewise graphs (vllm/cudagraph/piecewise.py): ``input_ids``
            and ``positions`` are padded to the pieces' token count (``graph_size`` when
            replayed), ``attn_metadata`` covers the real tokens only.
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata | None
    step: StepInputs
    sampling_metadata: SamplingMetadata | None
    virtual_engine: int
    num_real_rows: int
    batch_size: int
    max_decode_seq_len: int = 0
    graph_size: int | None = None
    eager_reason: str | None = None
    piecewise: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
