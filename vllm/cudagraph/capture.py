"""The pieces of one capture: the graph factory, a captured graph, a VE's static inputs.

The graph object comes from an injectable :class:`GraphCapturer` (torch.cuda.CUDAGraph in
production), so CI runs the production capture and replay code on CPU with a fake that
re-runs the captured function (tests/worker/fakes.py). The capturer also reports the
device memory reserved, which the capture log and the graph-memory estimate read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm.attention.backends.abstract import AttentionMetadata
from vllm.sequence import IntermediateTensors


class GraphCapturer:
    """Production graph factory: torch.cuda.CUDAGraph captured with torch.cuda.graph."""

    def new_pool(self) -> Any:
        """A memory pool handle every graph of one capture shares."""
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any], pool: Any) -> tuple[Any, Any]:
        """Capture ``fn`` into a new graph sharing ``pool``; returns (graph, fn's output)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph, out

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def memory_reserved(self, device: torch.device) -> int:
        """Bytes the caching allocator holds on ``device`` (0 off CUDA)."""
        if device.type == "cuda":
            return torch.cuda.memory_reserved(device)
        return 0

    def memory_allocated(self, device: torch.device) -> int:
        """Bytes of live tensors on ``device`` (0 off CUDA)."""
        if device.type == "cuda":
            return torch.cuda.memory_allocated(device)
        return 0


@dataclass
class CapturedGraph:
    """One captured graph of one VE (a decode batch or a one-sequence prefill).

    Attributes:
        size: batch rows (decode) or tokens (prefill) it was captured for.
        graph: the graph object (``replay()``).
        output: its static output ([size, hidden] tensor or IntermediateTensors).
        attn_metadata: metadata over the VE's graph buffers, refilled before each replay.
    """

    size: int
    graph: Any
    output: Any
    attn_metadata: AttentionMetadata


class StaticInputs:
    """A VE's static model inputs at the maximum size (views are taken per capture).

    Args:
        max_len: rows / tokens of the largest graph.
        hidden: hidden size (the received hidden states of a later PP stage).
        dtype, device: of the hidden states / of every buffer.
        first: first PP stage (no received hidden states).
    """

    def __init__(
        self, max_len: int, hidden: int, dtype: torch.dtype, device: torch.device, first: bool
    ):
        self.input_ids = torch.zeros(max_len, dtype=torch.long, device=device)  # [max_len]
        self.positions = torch.zeros(max_len, dtype=torch.long, device=device)  # [max_len]
        self.intermediate = None
        if not first:
            z = torch.zeros(max_len, hidden, dtype=dtype, device=device)  # [max_len, hidden]
            self.intermediate = IntermediateTensors({"hidden_states": z, "residual": z.clone()})

    def views(self, n: int) -> tuple[torch.Tensor, torch.Tensor, IntermediateTensors | None]:
        """(input ids [n], positions [n], received hidden states [n, hidden] or None)."""
        inter = None
        if self.intermediate is not None:
            inter = IntermediateTensors({k: v[:n] for k, v in self.intermediate.items()})
        return self.input_ids[:n], self.positions[:n], inter

    def upload(
        self,
        n: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
    ) -> None:
        """Copy a padded step's inputs ([n] int64 each, host or device) into the first
        ``n`` entries, asynchronously."""
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        if intermediate_tensors is not None:
            for k, v in intermediate_tensors.items():
                self.intermediate[k][:n].copy_(v, non_blocking=True)
