"""GraphSet: the captured graphs of one pipeline stage, for every virtual engine (VE).

Per VE (DESIGN.md guarantee 1): the attention backend's graph state, allocated once at
``max_batchsize_to_capture`` (and the largest prefill size), and the runner's static model
inputs (token ids, positions, and on later PP stages the received hidden states). Sizes are
captured largest first into ONE memory pool shared by all VEs and sizes, after warm-up runs
(prefill sizes, the largest activations, before decode sizes, then decode-loop sizes).
:class:`~vllm.cudagraph.runner.GraphRunner` plans and replays them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from vllm.attention.backends.abstract import (
    AttentionBackend,
    AttentionGraphState,
    AttentionMetadata,
    ForwardMode,
    StepInputs,
)
from vllm.cudagraph.capture import CapturedGraph, GraphCapturer, StaticInputs
from vllm.cudagraph.decode_loop import LoopGraph, capture_loop_graph
from vllm.cudagraph.piecewise import PieceBuffers, PieceGraphs, capture_pieces
from vllm.cudagraph.sizes import GraphSpec, warn_eager_sizes
from vllm.forward_context import set_forward_context
from vllm.sequence import IntermediateTensors

if TYPE_CHECKING:
    from vllm.model_executor.layers.sampler import Sampler

logger = logging.getLogger(__name__)


class GraphSet:
    """The graphs of every VE of one stage, captured by :meth:`capture`.

    Args:
        model, attn_backend, spec, device, dtype, hidden_size, first_stage, sampler: as
            for :class:`~vllm.cudagraph.runner.GraphRunner`.
        capturer: the graph factory (torch.cuda graphs in production).

    Attributes:
        graph_runners: graph_runners[ve][rows], each decode graph.
        prefill_graphs: prefill_graphs[ve][tokens], each one-sequence prefill graph.
        loops: loops[ve][rows], each decode-loop graph.
        piecewise: piecewise[ve][tokens], the piecewise graphs of prefill and mixed steps
            (vllm/cudagraph/piecewise.py; none when the model has no ``piecewise_model``).
        piece_buffers: per VE, the buffers between its pieces (None without pieces).
        attn_states, inputs: per VE, its attention graph state and static inputs.
        memory_trace: (label, bytes reserved, bytes of live tensors; both since capture
            began): "state" after a VE's buffers, then one entry per captured graph (the
            memory estimate reads it).
        capture_seconds, capture_bytes: wall time and device memory of :meth:`capture`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        attn_backend: AttentionBackend,
        spec: GraphSpec,
        device: torch.device,
        dtype: torch.dtype,
        hidden_size: int,
        first_stage: bool,
        sampler: Sampler | None,
        capturer: GraphCapturer,
    ):
        self.model = model
        self.attn_backend = attn_backend
        self.spec = spec
        self.device, self.dtype, self.hidden_size = device, dtype, hidden_size
        self.first_stage = first_stage
        self.sampler = sampler
        self.capturer = capturer
        self.graph_runners: list[dict[int, CapturedGraph]] = []
        self.prefill_graphs: list[dict[int, CapturedGraph]] = []
        self.loops: list[dict[int, LoopGraph]] = []
        self.piecewise: list[dict[int, PieceGraphs]] = []
        self.piece_buffers: list[PieceBuffers | None] = []
        self.attn_states: list[AttentionGraphState] = []
        self.inputs: list[StaticInputs] = []
        self.pool = None
        self._staged: list[Any] = []  # per VE, the event of its last replay's uploads
        self.capture_seconds = 0.0
        self.capture_bytes = 0
        self.memory_trace: list[tuple[str | int, int, int]] = []

    @torch.inference_mode()
    def capture(
        self, kv_caches: list[list[torch.Tensor]], scratch_slots: list[int], show_progress: bool
    ) -> None:
        """Capture every size for every VE (largest first, one shared pool).

        Args:
            kv_caches: kv_caches[ve][local_layer], the final caches (graphs bake in their
                addresses, so capture happens after the KV cache exists); one VE per entry.
            scratch_slots: per VE, its scratch slot.
        """
        from tqdm.auto import tqdm

        spec, cap, sizes = self.spec, self.capturer, self.spec.sizes
        n_ves = len(kv_caches)
        warn_eager_sizes(sizes)
        t0 = time.perf_counter()
        mem0 = cap.memory_reserved(self.device)
        live0 = cap.memory_allocated(self.device)
        self.pool = cap.new_pool()
        self.graph_runners = [{} for _ in range(n_ves)]
        self.prefill_graphs = [{} for _ in range(n_ves)]
        self.loops = [{} for _ in range(n_ves)]
        self.piecewise = [{} for _ in range(n_ves)]
        self._staged = [None] * n_ves
        pm = getattr(self.model, "piecewise_model", None)
        piece_sizes = spec.piecewise_sizes if pm is not None else ()
        per_ve = (len(sizes.sizes) + len(spec.loop_sizes) + len(spec.prefill_sizes)
                  + len(piece_sizes))  # fmt: skip
        inputs_len = max(sizes.max_batchsize_to_capture, *spec.prefill_sizes, *piece_sizes, 1)
        bar = tqdm(total=n_ves * per_ve, desc="Capturing CUDA graphs", disable=not show_progress)

        def trace(label: str | int) -> None:
            cap.synchronize()
            reserved = cap.memory_reserved(self.device) - mem0
            self.memory_trace.append((label, reserved, cap.memory_allocated(self.device) - live0))

        for ve in range(n_ves):
            with set_forward_context(ve):  # layers with per-VE state capture VE ve's
                state = self.attn_backend.make_graph_state(scratch_slots[ve])
                state.allocate(sizes.max_batchsize_to_capture)
                if spec.prefill_sizes:
                    state.allocate_prefill(spec.prefill_sizes[-1])
                static = StaticInputs(inputs_len, self.hidden_size, self.dtype, self.device,
                                      self.first_stage)  # fmt: skip
                self.attn_states.append(state)
                self.inputs.append(static)
                trace("state")
                bufs = None
                if piece_sizes:  # the largest activations of all: before every other graph
                    bufs = PieceBuffers(piece_sizes[-1], pm.piece_widths(), self.hidden_size,
                                        self.dtype, self.device)  # fmt: skip
                    for tokens in reversed(piece_sizes):
                        ids, _, inter = static.views(tokens)
                        self.piecewise[ve][tokens] = capture_pieces(
                            pm, bufs, len(kv_caches[ve]), ids, inter, cap, self.pool
                        )
                        trace(f"piecewise-{tokens}")
                        bar.update(1)
                self.piece_buffers.append(bufs)
                for tokens in reversed(spec.prefill_sizes):  # the largest activations first
                    graph = self._capture_one(ve, tokens, kv_caches[ve], prefill=True)
                    self.prefill_graphs[ve][tokens] = graph
                    trace(f"prefill-{tokens}")
                    bar.update(1)
                for size in sorted(sizes.sizes, reverse=True):
                    self.graph_runners[ve][size] = self._capture_one(ve, size, kv_caches[ve])
                    trace(size)
                    bar.update(1)
                for size in reversed(spec.loop_sizes):  # after the plain graphs, largest first
                    ids, pos, _ = static.views(size)
                    loop = capture_loop_graph(
                        self.model, self.sampler, state, ids, pos, kv_caches[ve], spec.loop_steps,
                        cap, self.pool,
                    )  # fmt: skip
                    if loop is not None:
                        self.loops[ve][size] = loop
                    trace(f"loop-{size}")
                    bar.update(1)
        bar.close()
        cap.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        self.capture_bytes = max(0, cap.memory_reserved(self.device) - mem0)
        logger.info(
            "Captured %d CUDA graphs (sizes %s, decode-loop sizes %s, prefill token counts "
            "%s, piecewise token counts %s with %d pieces each, %d virtual engines) in %.2f s "
            "using %.3f GiB",
            n_ves * (per_ve + len(piece_sizes) * len(kv_caches[0]) if n_ves else 0),
            list(sizes.sizes), sorted(self.loops[0]) if n_ves else [],
            list(spec.prefill_sizes), list(piece_sizes),
            len(kv_caches[0]) + 1 if n_ves else 0, n_ves, self.capture_seconds,
            self.capture_bytes / 2**30,
        )  # fmt: skip

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
        model = self.model

        def forward():
            return model(ids, pos, kv_caches, md, inter)

        # warm-up: lazy init, autotuning, allocator caching, all done by the first eager run;
        # prefill graphs (eleven by default, each a full prompt's forward) take one
        for _ in range(1 if prefill else 2):
            forward()
        self.capturer.synchronize()
        graph, out = self.capturer.capture(forward, self.pool)
        return CapturedGraph(size=size, graph=graph, output=out, attn_metadata=md)

    def stage_inputs(
        self,
        virtual_engine: int,
        size: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: StepInputs,
        attn_metadata: AttentionMetadata,
        intermediate_tensors: IntermediateTensors | None = None,
        loop_steps: int = 0,
    ) -> None:
        """Before replaying a graph of ``size`` rows or prefill tokens (plain, or a
        decode-loop graph about to replay ``loop_steps`` times): upload the padded inputs
        ([size] int64 each) into the VE's static inputs, fill the attention buffers behind
        ``attn_metadata`` for ``step`` and record the staged event (see
        :meth:`staged_event`)."""
        static = self.inputs[virtual_engine]
        static.upload(size, input_ids, positions, intermediate_tensors)
        state = self.attn_states[virtual_engine]
        if step.mode == ForwardMode.PREFILL:
            state.prepare_prefill_replay(size, step, attn_metadata)
        elif loop_steps:
            state.prepare_loop(size, step, attn_metadata, loop_steps)
        else:
            state.prepare_replay(size, step, attn_metadata)
        self._record_staged(virtual_engine)

    def stage_piece_inputs(
        self,
        virtual_engine: int,
        size: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> None:
        """Before replaying the piecewise graphs of ``size`` tokens: upload the padded
        inputs ([size] int64 each) into the VE's static inputs and record the staged event
        (the attention between pieces runs on the step's own metadata)."""
        self.inputs[virtual_engine].upload(size, input_ids, positions, intermediate_tensors)
        self._record_staged(virtual_engine)

    def _record_staged(self, virtual_engine: int) -> None:
        if self.inputs[virtual_engine].input_ids.is_cuda:
            if self._staged[virtual_engine] is None:
                self._staged[virtual_engine] = torch.cuda.Event()
            self._staged[virtual_engine].record()

    def staged_event(self, virtual_engine: int) -> Any:
        """The CUDA event recorded after the last replay of ``virtual_engine`` queued its
        input uploads (None before any CUDA replay)."""
        return self._staged[virtual_engine]
