"""CUDA-graph capture and replay of decode steps and single-sequence prefills, per VE.

Decode: a decode step has one token per row, so its shapes depend on the batch size alone
and a handful of bucketed sizes covers every step. Prefill: a batch of prompts has shapes
that depend on every prompt length, but ONE prompt's depend on its length alone, so
prompts padded to a ladder of token counts (``cuda_graph_sizes.prefill_capture_sizes``)
replay prefill graphs when the backend supports them (``supports_prefill_graphs``; the
runner asks for them at PP = 1). That matters when a prefill is host-bound: SmolLM2's
128-token prefill is ~30 us of GPU work per layer under ~0.5 ms of launches.

Recipe (docs/design.md, guarantees 1-3 and 5):
- sizes come from :func:`vllm.worker.cuda_graph_sizes.capture_sizes` (k-aware);
- for every virtual engine (VE): the attention backend allocates that VE's graph state
  once at ``max_batchsize_to_capture``; the runner allocates that VE's static model inputs
  (token ids, positions, and on later PP stages the received hidden states);
- sizes are captured largest first into ONE memory pool shared by all VEs and sizes,
  after warm-up runs (prefill sizes, the largest activations, before decode sizes);
  ``graph_runners[ve][size]`` holds each decode graph and its output,
  ``prefill_graphs[ve][tokens]`` each prefill graph;
- a step replays only if ``_use_captured_graph`` finds its padded size in that VE's
  ``graph_runners`` (membership, not a second copy of the rule) and its longest context,
  lookahead slots included, fits ``max_seq_len_to_capture``; otherwise it runs eagerly;
- every step is counted: replays per (VE, size), eager steps per (VE, reason).

The graph object comes from an injectable :class:`GraphCapturer` (torch.cuda.CUDAGraph in
production), so CI runs this exact code on CPU with a fake that re-runs the function.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm.attention.backends.abstract import (
    AttentionGraphState,
    AttentionMetadata,
    ForwardMode,
)
from vllm.sequence import IntermediateTensors
from vllm.worker.cuda_graph_sizes import CaptureSizes, next_size, warn_eager_sizes
from vllm.worker.decode_loop import LoopGraph, capture_loop_graph
from vllm.worker.step_counters import DecodeStepCounters

logger = logging.getLogger(__name__)


class GraphCapturer:
    """Production graph factory: torch.cuda.CUDAGraph captured with torch.cuda.graph."""

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any], pool: Any) -> tuple[Any, Any]:
        """Capture ``fn`` into a new graph sharing ``pool``; returns (graph, fn's output)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph, out

    def synchronize(self) -> None:
        torch.cuda.synchronize()


@dataclass
class CapturedGraph:
    """One captured decode graph of one VE.

    Attributes:
        size: batch rows it was captured for.
        graph: the graph object (``replay()``).
        output: its static output ([size, hidden] tensor or IntermediateTensors).
        attn_metadata: metadata over the VE's graph buffers, refilled before each replay.
    """

    size: int
    graph: Any
    output: Any
    attn_metadata: AttentionMetadata


class _StaticInputs:
    """A VE's static model inputs at the maximum size (views are taken per capture)."""

    def __init__(
        self, max_bs: int, hidden: int, dtype: torch.dtype, device: torch.device, first: bool
    ):
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)  # [max_bs]
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)  # [max_bs]
        self.intermediate = None
        if not first:
            z = torch.zeros(max_bs, hidden, dtype=dtype, device=device)  # [max_bs, hidden]
            self.intermediate = IntermediateTensors({"hidden_states": z, "residual": z.clone()})

    def views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, IntermediateTensors | None]:
        inter = None
        if self.intermediate is not None:
            inter = IntermediateTensors({k: v[:bs] for k, v in self.intermediate.items()})
        return self.input_ids[:bs], self.positions[:bs], inter


class GraphRunner:
    """Captures and replays decode graphs for every virtual engine of one model runner.

    Args:
        model_runner: the owning ModelRunner (model, backend, device, dtype, stage).
        sizes: the capture sizes (from the one rule).
        num_virtual_engines: how many VEs (each gets its own buffers and graphs).
        max_seq_len_to_capture: longest context a graph serves.
        capturer: graph factory (GraphCapturer in production; a fake in CPU tests).
    """

    def __init__(
        self,
        model_runner: Any,
        sizes: CaptureSizes,
        num_virtual_engines: int,
        max_seq_len_to_capture: int,
        capturer: Any = None,
        loop_sizes: tuple[int, ...] = (),
        loop_steps: int = 0,
        prefill_sizes: tuple[int, ...] = (),
    ):
        self.model_runner = model_runner
        self.sizes = sizes
        self.max_batchsize_to_capture = sizes.max_batchsize_to_capture
        self.num_virtual_engines = num_virtual_engines
        self.max_seq_len_to_capture = max_seq_len_to_capture
        self.capturer = capturer or GraphCapturer()
        self.graph_runners: list[dict[int, CapturedGraph]] = [
            {} for _ in range(num_virtual_engines)
        ]
        # decode-loop graphs (vllm/worker/decode_loop.py): loops[ve][size]
        self.loop_sizes = tuple(loop_sizes)
        self.loop_steps = loop_steps
        self.loops: list[dict[int, LoopGraph]] = [{} for _ in range(num_virtual_engines)]
        # single-sequence prefill graphs: prefill_graphs[ve][tokens]
        self.prefill_sizes = tuple(sorted(prefill_sizes))
        self.prefill_graphs: list[dict[int, CapturedGraph]] = [
            {} for _ in range(num_virtual_engines)
        ]
        self.attn_states: list[AttentionGraphState] = []
        self.inputs: list[_StaticInputs] = []
        self.pool = None
        # per VE, a CUDA event recorded once a replay's inputs are queued (None on CPU)
        self._staged: list[Any] = [None] * num_virtual_engines
        self.capture_seconds = 0.0
        self.capture_bytes = 0
        # (label, device bytes reserved since capture began): "state" after a VE's buffers,
        # then one entry per captured size; used to extrapolate graph memory.
        self.memory_trace: list[tuple[str | int, int]] = []
        self.eager_warning = warn_eager_sizes(sizes)

    # ----------------------------------------------------------------- capture
    @torch.inference_mode()
    def capture_model(
        self,
        kv_caches: list[list[torch.Tensor]],
        scratch_slots: list[int],
        show_progress: bool = True,
    ) -> None:
        """Capture every size for every VE (largest first, one shared pool).

        Args:
            kv_caches: kv_caches[ve][local_layer], the final caches (graphs bake in their
                addresses, so capture happens after the KV cache exists).
            scratch_slots: per VE, its scratch slot.
        """
        from tqdm.auto import tqdm

        mr = self.model_runner
        t0 = time.perf_counter()
        mem0 = _device_memory(mr.device)
        self.pool = self.capturer.new_pool()
        hidden = mr.model_config.hf_config.hidden_size
        per_ve = len(self.sizes.sizes) + len(self.loop_sizes) + len(self.prefill_sizes)
        total = self.num_virtual_engines * per_ve
        inputs_len = max(self.max_batchsize_to_capture, *self.prefill_sizes, 1)
        bar = tqdm(total=total, desc="Capturing CUDA graphs", disable=not show_progress)
        for ve in range(self.num_virtual_engines):
            state = mr.attn_backend.make_graph_state(scratch_slots[ve])
            state.allocate(self.max_batchsize_to_capture)
            if self.prefill_sizes:
                state.allocate_prefill(self.prefill_sizes[-1])
            static = _StaticInputs(inputs_len, hidden, mr.dtype, mr.device, mr.is_first_stage)
            self.attn_states.append(state)
            self.inputs.append(static)
            self.memory_trace.append(("state", _device_memory(mr.device) - mem0))
            for tokens in reversed(self.prefill_sizes):  # the largest activations first
                self.prefill_graphs[ve][tokens] = self._capture_one(
                    ve, tokens, kv_caches[ve], prefill=True
                )
                self.memory_trace.append((f"prefill-{tokens}", _device_memory(mr.device) - mem0))
                bar.update(1)
            for size in sorted(self.sizes.sizes, reverse=True):
                self.graph_runners[ve][size] = self._capture_one(ve, size, kv_caches[ve])
                self.memory_trace.append((size, _device_memory(mr.device) - mem0))
                bar.update(1)
            for size in self.loop_sizes:  # small, so after the largest plain graphs
                loop = capture_loop_graph(self, ve, size, kv_caches[ve], self.loop_steps)
                if loop is not None:
                    self.loops[ve][size] = loop
                bar.update(1)
        bar.close()
        self.capturer.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        self.capture_bytes = max(0, _device_memory(mr.device) - mem0)
        logger.info(
            "Captured %d CUDA graphs (sizes %s, decode-loop sizes %s, prefill token counts "
            "%s, %d virtual engines) in %.2f s using %.3f GiB",
            total,
            list(self.sizes.sizes),
            sorted(self.loops[0]) if self.loops else [],
            list(self.prefill_sizes),
            self.num_virtual_engines,
            self.capture_seconds,
            self.capture_bytes / 2**30,
        )

    def _capture_one(
        self, ve: int, size: int, kv_caches: list[torch.Tensor], prefill: bool = False
    ) -> CapturedGraph:
        """Capture one graph of VE ``ve``: a decode batch of ``size`` rows, or with
        ``prefill`` one prompt of ``size`` tokens (every token on the scratch slot)."""
        state = self.attn_states[ve]
        if prefill:
            md = state.prefill_metadata_for_capture(size)
        else:
            md = state.metadata_for_capture(size)
        ids, pos, inter = self.inputs[ve].views(size)
        model = self.model_runner.model

        def forward():
            return model(ids, pos, kv_caches, md, inter)

        # warm-up: lazy init, autotuning, allocator caching, all done by the first eager run;
        # prefill graphs (eleven by default, each a full prompt's forward) take one
        for _ in range(1 if prefill else 2):
            forward()
        self.capturer.synchronize()
        graph, out = self.capturer.capture(forward, self.pool)
        return CapturedGraph(size=size, graph=graph, output=out, attn_metadata=md)

    # ---------------------------------------------------------------- dispatch
    def _use_captured_graph(
        self, virtual_engine: int, batch_size: int, max_decode_seq_len: int
    ) -> bool:
        """True when a decode batch of ``batch_size`` rows whose longest context (lookahead
        slots included) is ``max_decode_seq_len`` can replay a graph of this VE: its padded
        size was captured for this VE and the context fits ``max_seq_len_to_capture``."""
        padded = self.sizes.padded_size(batch_size)
        if padded is None or padded not in self.graph_runners[virtual_engine]:
            return False
        return max_decode_seq_len <= self.max_seq_len_to_capture

    def prefill_graph_size(self, virtual_engine: int, num_rows: int, num_tokens: int) -> int | None:
        """The captured prefill size (tokens) a prefill of ``num_rows`` sequences and
        ``num_tokens`` tokens pads to, or None (eager): one sequence and a token count up to
        the largest size captured for this VE."""
        if num_rows != 1:
            return None
        size = next_size(self.prefill_sizes, num_tokens)
        return size if size in self.prefill_graphs[virtual_engine] else None

    def eager_reason(
        self, virtual_engine: int, mode: ForwardMode, batch_size: int, max_decode_seq_len: int
    ) -> str | None:
        """Why a step runs eagerly ("prefill", "too_big", "too_long"), or None to replay."""
        if mode != ForwardMode.DECODE:
            return "prefill"
        if self._use_captured_graph(virtual_engine, batch_size, max_decode_seq_len):
            return None
        padded = self.sizes.padded_size(batch_size)
        if padded is None or padded not in self.graph_runners[virtual_engine]:
            return "too_big"
        return "too_long"

    def padded_size(self, batch_size: int) -> int:
        padded = self.sizes.padded_size(batch_size)
        return batch_size if padded is None else padded

    def replay(
        self,
        virtual_engine: int,
        size: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: Any,
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        """Copy a padded batch into the VE's static inputs, prepare attention (planning
        outside the graph) and replay ``graph_runners[virtual_engine][size]``, or for a
        prefill step ``prefill_graphs[virtual_engine][size]``.

        Args:
            input_ids, positions: [size] int64 (padded lanes or tokens included).
            step: the host StepInputs (padded to ``size`` rows, or for a prefill to
                ``size`` tokens of its one row).
        Returns:
            The graph's static output for ``size`` rows or tokens (valid until the next
            replay).
        """
        if step.mode == ForwardMode.PREFILL:
            cg = self.prefill_graphs[virtual_engine][size]
        else:
            cg = self.graph_runners[virtual_engine][size]
        self.stage_inputs(
            virtual_engine, size, input_ids, positions, step, cg.attn_metadata,
            intermediate_tensors,
        )  # fmt: skip
        cg.graph.replay()
        return cg.output

    def stage_inputs(
        self,
        virtual_engine: int,
        size: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: Any,
        attn_metadata: AttentionMetadata,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> None:
        """Before replaying a graph of ``size`` rows (plain or decode-loop): upload the
        padded batch into the VE's static inputs, fill the attention buffers behind
        ``attn_metadata`` for ``step`` and record the staged event (see
        :meth:`staged_event`). Shapes as in :meth:`replay`."""
        static = self.inputs[virtual_engine]
        static.input_ids[:size].copy_(input_ids, non_blocking=True)
        static.positions[:size].copy_(positions, non_blocking=True)
        if intermediate_tensors is not None:
            for k, v in intermediate_tensors.items():
                static.intermediate[k][:size].copy_(v, non_blocking=True)
        state = self.attn_states[virtual_engine]
        if step.mode == ForwardMode.PREFILL:
            state.prepare_prefill_replay(size, step, attn_metadata)
        else:
            state.prepare_replay(size, step, attn_metadata)
        if static.input_ids.is_cuda:
            if self._staged[virtual_engine] is None:
                self._staged[virtual_engine] = torch.cuda.Event()
            self._staged[virtual_engine].record()

    def loop_graph(self, virtual_engine: int, size: int) -> LoopGraph | None:
        """The decode-loop graph of ``virtual_engine`` for captured size ``size``, or None."""
        return self.loops[virtual_engine].get(size)

    def staged_event(self, virtual_engine: int) -> Any:
        """The CUDA event recorded after the last replay of ``virtual_engine`` queued its
        input uploads (None before any CUDA replay): once it completes, the host may reuse
        staging buffers (multi-step decoding waits on it before planning the next step)."""
        return self._staged[virtual_engine]


def extrapolate_graph_memory(
    trace: list[tuple[str | int, int]], num_sizes: int, num_ves: int
) -> int:
    """Graph memory of a full capture from a trial capture of one VE: ``trace`` =
    [("state", s), optionally ("prefill-<tokens>", p) for the largest prefill graph,
    (largest decode size, a), (the next size down, b)] in bytes since capture began.

    Estimate = a (state buffers + the shared pool after the largest graphs) + (b - a) per
    further decode graph (each keeps its own outputs and metadata, e.g. a FlashInfer
    wrapper's int workspace) + s per further VE (its own buffers); the caller adds the
    outputs of further prefill graphs. Documented as an estimate: the final capture's GiB
    are logged too.
    """
    state = trace[0][1]
    decode = [mem for label, mem in trace if isinstance(label, int)]
    first = decode[0] if decode else trace[-1][1]
    per_graph = max(0, decode[1] - decode[0]) if len(decode) > 1 else 0
    return first + per_graph * max(0, num_sizes * num_ves - 1) + state * max(0, num_ves - 1)


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_reserved(device)
    return 0


__all__ = ["CapturedGraph", "DecodeStepCounters", "GraphCapturer", "GraphRunner"]
