"""The graph-memory estimate: what capture will take, measured before the KV cache exists.

Capture needs the final KV cache (graphs bake in its addresses) but the KV cache is sized
from what is left after the graphs, so the graphs are measured first by a trial capture
into a throwaway pool over a one-block cache, and extrapolated (:func:`extrapolate`).

The trial captures the two largest decode sizes, not the largest and the smallest: the
second graph's increment is what each further graph costs, and the smallest size may take
a path that allocates nothing per size (FLASHINFER's one-row small-decode kernel) where the
others each build a wrapper with its own 8 MiB int workspace (measured on an H200: 0.079
GiB estimated against 0.363 GiB captured for SmolLM2's 46 graphs with a largest / smallest
probe). Sizes on such a cheaper path are over-counted by that difference, which errs on
the safe side.

The reserved memory of the trial does not show what a further graph costs: PyTorch's CUDA
caching allocator serves blocks of 1-10 MiB from 20 MiB segments, so the second probe's
8 MiB wrapper workspace usually fits in the segment the first one opened, and its increment
reads 0 (on an H200, SmolLM2 with 46 graphs: 0.085 GiB estimated against 0.390 GiB
captured). A further graph is therefore charged the larger of its reserved increment and
its live tensors' increment packed as the allocator packs them (:func:`segment_cost`).

Every virtual engine (VE) is counted as a whole first VE: its own state buffers, wrappers
and outputs, and the pool memory of its largest graphs. The pool is shared, so a further
VE often reuses that memory, but not always. A further VE never costs more than the first
(the same graphs over same-size buffers), so VEs x one VE bounds the capture; the price is
an over-estimate of up to one pool per further VE when the pool is reused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm.cudagraph.capture import GraphCapturer
from vllm.cudagraph.sizes import CaptureSizes, GraphSpec

if TYPE_CHECKING:
    from vllm.cudagraph.runner import GraphRunner


MIB = 2**20
# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): blocks of at most
# 1 MiB come from 2 MiB segments, blocks up to 10 MiB from 20 MiB segments, larger ones
# get a segment of their own rounded up to 2 MiB.
_SMALL_BLOCK, _SMALL_SEGMENT = 1 * MIB, 2 * MIB
_MID_BLOCK, _MID_SEGMENT = 10 * MIB, 20 * MIB
_LARGE_ROUND = 2 * MIB


def segment_cost(nbytes: int) -> int:
    """Reserved bytes per allocation of ``nbytes`` when many are made in a row: the share of
    a segment each takes (a 20 MiB segment holds two 8 MiB blocks: 10 MiB each), or the
    allocation rounded up to 2 MiB above 10 MiB. 0 for ``nbytes <= 0``."""
    if nbytes <= 0:
        return 0
    if nbytes <= _SMALL_BLOCK:
        return _SMALL_SEGMENT // max(1, _SMALL_SEGMENT // nbytes)
    if nbytes <= _MID_BLOCK:
        return _MID_SEGMENT // max(1, _MID_SEGMENT // nbytes)
    return -(-nbytes // _LARGE_ROUND) * _LARGE_ROUND


def extrapolate(
    trace: list[tuple[str | int, int, int]],
    num_graphs: int,
    num_ves: int,
    further_prefill_bytes: int = 0,
) -> int:
    """Graph memory of a full capture from a trial capture of one VE.

    Args:
        trace: [("state", ...), optionally ("prefill-<tokens>", ...) for the largest
            prefill graph, (largest decode size, a, la), (the next size down, b, lb),
            optionally ("loop-<rows>", c, lc) for the largest decode-loop graph]: bytes
            reserved and bytes of live tensors since the trial began.
        num_graphs: decode and decode-loop graphs per VE.
        num_ves: virtual engines.
        further_prefill_bytes: per VE, the outputs of the prefill and piecewise graphs the
            trial did not capture (each size keeps its [tokens, hidden] output).
    Returns:
        num_ves x (a + g x (num_graphs - 1) + further_prefill_bytes + l) with
        g = max(b - a, segment_cost(lb - la)) and l = max(0, c - b): a holds the state
        buffers, the shared pool after the largest graphs and the largest decode graph; each
        further graph keeps its own outputs and metadata (e.g. a FlashInfer wrapper's int
        workspace); l is what the pool grows by for the largest decode-loop graph (its
        logits and sampling, [rows, vocab], are the largest tensors a decode graph
        makes). An estimate: the capture logs what it actually took.
    """
    decode = [(mem, live) for label, mem, live in trace if isinstance(label, int)]
    first = decode[0][0] if decode else trace[-1][1]
    per_graph = 0
    if len(decode) > 1:
        (a, la), (b, lb) = decode[:2]
        per_graph = max(0, b - a, segment_cost(lb - la))
    loops = [mem for label, mem, _ in trace if str(label).startswith("loop-")]
    loop_extra = max(0, loops[-1] - decode[-1][0]) if loops and decode else 0
    one_ve = first + per_graph * max(0, num_graphs - 1) + further_prefill_bytes + loop_extra
    return num_ves * one_ve


@torch.inference_mode()
def estimate_graph_memory(
    runner: GraphRunner,
    kv_caches: list[torch.Tensor],
    scratch_slot: int,
    num_virtual_engines: int,
    capturer: GraphCapturer | None = None,
) -> int:
    """Bytes ``runner.capture`` will take for ``num_virtual_engines`` VEs: a trial capture
    of one VE (the two largest decode sizes, the largest prefill, the largest
    piecewise size and the largest decode-loop size, whose buffers and pool serve the
    smaller ones) over ``kv_caches``
    (one small cache, [local_layer]), extrapolated by :func:`extrapolate`. 0 without
    decode sizes."""
    spec = runner.spec
    sizes = spec.sizes.sizes
    if not sizes:
        return 0
    probe = tuple(sorted(sizes)[-2:])
    trial_spec = GraphSpec(CaptureSizes(probe, probe[-1], probe[-1]),
                           prefill_sizes=spec.prefill_sizes[-1:],
                           loop_sizes=spec.loop_sizes[-1:], loop_steps=spec.loop_steps,
                           max_seq_len_to_capture=spec.max_seq_len_to_capture,
                           piecewise_sizes=spec.piecewise_sizes[-1:])  # fmt: skip
    trial = runner.with_spec(trial_spec)
    trial.capture([kv_caches], [scratch_slot], capturer, show_progress=False)
    trace = trial.graphs.memory_trace
    del trial
    row = runner.hidden_size * torch.empty((), dtype=runner.dtype).element_size()
    further = (sum(spec.prefill_sizes) - sum(spec.prefill_sizes[-1:])) * row
    # each smaller piecewise size keeps its last piece's output, allocated as the pool packs it
    further += sum(segment_cost(n * row) for n in spec.piecewise_sizes[:-1])
    return extrapolate(trace, len(sizes) + len(spec.loop_sizes), num_virtual_engines, further)
