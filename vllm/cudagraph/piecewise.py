"""Piecewise CUDA graphs: prefill and mixed steps replayed layer by layer, attention eager.

A step with prefill tokens (a batch of prompts, or chunked prefill's mix of chunks and
decode rows) has attention shapes that depend on every row's query and context length, so
no single graph serves it, and run eagerly its layers cost a launch per kernel from Python
(about 0.6 ms per layer measured for SmolLM2 on an H200, several times its GPU time). But
everything in a decoder layer except the attention call is row-wise: norms, projections,
the MLP (a mixture of experts routes each row on its own). The model's forward is
therefore cut at every attention call into L + 1 pieces (``model.piecewise_model``:
``piece_first``, ``piece_between``, ``piece_last``), each captured once per token count N
of a ladder (:func:`vllm.cudagraph.sizes.piecewise_capture_sizes`, up to
``CompilationConfig.piecewise_graph_max_tokens``). A step of T <= N tokens uploads its
token ids and positions padded to N (token 0, position 0), replays piece 0, then for every
layer runs the attention call eagerly on the first T rows (``piece_attend``: rotary,
KV-cache write over the step's T slots, attention with the step's own metadata) and
replays the next piece.

Exactness: a replay runs the kernels its capture ran, on N rows; the padded rows never
reach a real one (the pieces are row-wise, the attention reads and writes only the first T
rows), so a replay equals the same pieces run eagerly at N rows (the eager padding switch,
``ModelRunner.pad_eager_batches``); against the unpadded eager forward it may differ by a
GEMM's choice of kernel for another row count, as padded decode graphs do.

Memory: per virtual engine one set of buffers at the largest N, shared by its sizes
(views ``[:N]``): the qkv [N, qkv width], the residual [N, hidden] and the attention
output [N, attention width]. Each piece ends by copying its qkv and residual into them,
so the graphs' memory does not grow with the layer count; the last piece's output is its
graph's output, one per size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from vllm.sequence import IntermediateTensors


class PieceBuffers:
    """One VE's buffers between pieces, at ``max_tokens`` rows.

    Args:
        max_tokens: rows of the largest piecewise size.
        widths: (qkv width, attention output width) from ``piece_widths()``.
        hidden: the model's hidden size.
        dtype, device: of the model's activations.
    """

    def __init__(
        self,
        max_tokens: int,
        widths: tuple[int, int],
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        qkv_width, attn_width = widths
        self.qkv = torch.zeros(max_tokens, qkv_width, dtype=dtype, device=device)  # [N, qkv]
        self.residual = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)  # [N, H]
        self.attn = torch.zeros(max_tokens, attn_width, dtype=dtype, device=device)  # [N, A]


def piece_fns(
    pm: Any,
    bufs: PieceBuffers,
    num_layers: int,
    input_ids: torch.Tensor,
    intermediate_tensors: IntermediateTensors | None,
) -> list[Callable[[], Any]]:
    """The ``num_layers + 1`` pieces of one token count N = ``input_ids.shape[0]``.

    Piece 0 reads ``input_ids`` [N] (or ``intermediate_tensors``, [N, hidden] each); every
    piece but the last writes qkv [N, qkv width] and residual [N, hidden] into ``bufs``
    and returns None; pieces after the first read ``bufs.attn`` and ``bufs.residual``. The
    last returns the stage's output ([N, hidden] hidden states on the last stage, else
    IntermediateTensors).
    """
    n = input_ids.shape[0]
    qkv_buf, res_buf, attn_buf = bufs.qkv[:n], bufs.residual[:n], bufs.attn[:n]

    def store(out: tuple[torch.Tensor, torch.Tensor]) -> None:
        qkv, residual = out
        qkv_buf.copy_(qkv)  # [N, qkv width]
        res_buf.copy_(residual)  # [N, hidden]

    def first() -> None:
        store(pm.piece_first(input_ids, intermediate_tensors))

    def between(i: int) -> Callable[[], None]:
        return lambda: store(pm.piece_between(i, attn_buf, res_buf))

    def last() -> Any:
        return pm.piece_last(attn_buf, res_buf)

    return [first, *(between(i) for i in range(1, num_layers)), last]


def run_pieces(
    pm: Any,
    calls: list[Callable[[], Any]],
    bufs: PieceBuffers,
    positions: torch.Tensor,
    kv_caches: list[torch.Tensor],
    attn_metadata: Any,
) -> Any:
    """Run one step: ``calls[0]``, then per local layer ``i`` its attention eagerly on the
    step's T = ``positions.shape[0]`` real tokens and ``calls[i + 1]``.

    Args:
        pm: the model's ``piecewise_model``.
        calls: the pieces (graph replays, or :func:`piece_fns` run eagerly); the last
            returns the output.
        bufs: the buffers the pieces were built over.
        positions: [T] int64, the real tokens' positions.
        kv_caches: one per local layer.
        attn_metadata: the step's metadata, built for its T real tokens.
    Returns:
        What the last call returns (N rows; the caller keeps the first T).
    """
    t = positions.shape[0]
    calls[0]()
    for i, kv_cache in enumerate(kv_caches):
        out = pm.piece_attend(i, positions, bufs.qkv[:t], kv_cache, attn_metadata)
        bufs.attn[:t].copy_(out)  # [T, attention width]
        result = calls[i + 1]()
    return result


@dataclass
class PieceGraphs:
    """The captured pieces of one token count of one VE.

    Attributes:
        size: tokens N.
        graphs: the ``num_layers + 1`` graphs, in order.
        output: the last graph's static output (N rows).
    """

    size: int
    graphs: list[Any]
    output: Any

    @cached_property
    def calls(self) -> list[Callable[[], Any]]:
        """Replays for :func:`run_pieces` (the last one returns :attr:`output`), made once."""
        *head, tail = self.graphs

        def last() -> Any:
            tail.replay()
            return self.output

        return [g.replay for g in head] + [last]


def capture_pieces(
    pm: Any,
    bufs: PieceBuffers,
    num_layers: int,
    input_ids: torch.Tensor,
    intermediate_tensors: IntermediateTensors | None,
    capturer: Any,
    pool: Any,
) -> PieceGraphs:
    """Capture the pieces of N = ``input_ids.shape[0]`` tokens (static views) into
    ``pool``, after one eager warm-up run of each (lazy initialisation, autotuning); the
    attention is not run (the buffers between pieces hold whatever they held)."""
    fns = piece_fns(pm, bufs, num_layers, input_ids, intermediate_tensors)
    for fn in fns:
        fn()
    capturer.synchronize()
    graphs, out = [], None
    for fn in fns:
        graph, out = capturer.capture(fn, pool)
        graphs.append(graph)
    return PieceGraphs(int(input_ids.shape[0]), graphs, out)
