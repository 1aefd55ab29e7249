"""GraphRunner: the one object that decides, per step, graph replay or eager, and runs it.

Decode: a decode step has one token per row, so its shapes depend on the batch size alone
and a handful of bucketed sizes covers every step. Prefill: a batch of prompts has shapes
that depend on every prompt length, but ONE prompt's depend on its length alone, so
prompts padded to a ladder of token counts (``sizes.prefill_capture_sizes``) replay
prefill graphs when the backend supports them (PP = 1 only). That matters when a prefill
is host-bound: SmolLM2's 128-token prefill is ~30 us of GPU work per layer under ~0.5 ms
of launches.

Recipe (DESIGN.md guarantees 1-3 and 5):
- sizes come from :func:`vllm.cudagraph.sizes.graph_spec` (k-aware);
- for every virtual engine (VE): the attention backend allocates that VE's graph state
  once at ``max_batchsize_to_capture``; the runner allocates that VE's static model inputs
  (token ids, positions, and on later PP stages the received hidden states);
- sizes are captured largest first into ONE memory pool shared by all VEs and sizes,
  after warm-up runs (prefill sizes, the largest activations, before decode sizes), into
  a :class:`~vllm.cudagraph.graph_set.GraphSet`: decode graphs, prefill graphs and
  decode-loop graphs (vllm/cudagraph/decode_loop.py) per VE;
- :meth:`GraphRunner.plan` replays a decode step only if its padded size was captured for
  its VE (membership, not a second copy of the rule) and its longest context, lookahead
  slots included, fits ``max_seq_len_to_capture``; otherwise the step runs eagerly;
- every step is counted by :meth:`GraphRunner.run`: replays per (VE, size), eager steps
  per (VE, reason).

Chunked prefill: a step with prefill chunks and decode rows (ForwardMode.MIXED) has shapes
that depend on every chunk and decode row, so no whole-step graph serves it. A
decode-only step replays as above; a prefill-only step (chunks included) plans as a prefill
(a first chunk without cached context may replay a prefill graph: it attends only among its
own tokens). :meth:`_use_captured_graph` keeps answering from what was captured.

Piecewise graphs (vllm/cudagraph/piecewise.py, ``piecewise_graph_max_tokens`` > 0): a
mixed step, or a prefill step no prefill graph serves, whose token count fits a captured
piecewise size replays that size's pieces with the attention run eagerly between them
(counted per (VE, tokens) as "piecewise_graph"); otherwise it runs eagerly, with the reason
"mixed" or "prefill".

Before :meth:`GraphRunner.capture` (CPU, enforce_eager, or before start-up finishes) the
same object plans every step eagerly ("enforce_eager"), padded like a graph only under the
eager debug switch, so callers never ask whether graphs exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm.attention.backends.abstract import AttentionBackend, ForwardMode
from vllm.cudagraph.capture import GraphCapturer
from vllm.cudagraph.counters import DecodeStepCounters
from vllm.cudagraph.decode_loop import eligible
from vllm.cudagraph.graph_set import GraphSet
from vllm.cudagraph.piecewise import PieceBuffers, piece_fns, run_pieces
from vllm.cudagraph.sizes import GraphSpec, next_size
from vllm.sequence import IntermediateTensors

if TYPE_CHECKING:
    from vllm.model_executor.forward_batch import ForwardBatch
    from vllm.model_executor.layers.sampler import Sampler


@dataclass(frozen=True)
class Plan:
    """How one step runs.

    Attributes:
        pad_to: rows (decode) or tokens (prefill) the step is padded to (padded lanes or
            tokens: token 0, position 0, slot -1); 0 when it runs at its own size.
        graph_size: the captured size it replays (decode: rows; prefill: tokens), or None.
        eager_reason: why it runs eagerly ("prefill", "enforce_eager", "too_big",
            "too_long", "mixed"), None when it replays.
        piecewise: the step runs as pieces (vllm/cudagraph/piecewise.py): replayed when
            ``graph_size`` is set, else run eagerly padded to ``pad_to`` tokens (the eager
            padding switch); only its token ids and positions are padded.
    """

    pad_to: int
    graph_size: int | None
    eager_reason: str | None
    piecewise: bool = False


class GraphRunner:
    """Plans every step of one pipeline stage (replay or eager), captures the graphs of
    every VE and runs what it planned.

    Args:
        model: this stage's model (``model(ids, positions, kv_caches, metadata,
            intermediate)``; ``compute_logits`` on the last stage).
        attn_backend: builds each VE's graph state (``make_graph_state``).
        spec: the sizes to capture (:func:`vllm.cudagraph.sizes.graph_spec`).
        device, dtype: of the static inputs (dtype: the received hidden states).
        hidden_size: the model's hidden size.
        first_stage: PP stage 0 (takes token ids, receives no hidden states).
        sampler: samples inside decode-loop graphs (needed when ``spec.loop_sizes``).
        counters: where replayed and eager steps are counted.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        attn_backend: AttentionBackend,
        spec: GraphSpec,
        device: torch.device,
        dtype: torch.dtype,
        hidden_size: int,
        first_stage: bool = True,
        sampler: Sampler | None = None,
        counters: DecodeStepCounters | None = None,
    ):
        self.model = model
        self.attn_backend = attn_backend
        self.spec = spec
        self.sizes = spec.sizes
        self.max_batchsize_to_capture = spec.sizes.max_batchsize_to_capture
        self.max_seq_len_to_capture = spec.max_seq_len_to_capture
        self.device, self.dtype, self.hidden_size = device, dtype, hidden_size
        self.first_stage = first_stage
        self.sampler = sampler
        self.counters = counters if counters is not None else DecodeStepCounters()
        self.graphs: GraphSet | None = None  # after capture()
        self._eager_piece_buffers: PieceBuffers | None = None  # eager padding switch only

    def with_spec(self, spec: GraphSpec) -> GraphRunner:
        """A new, uncaptured runner over the same model and backend capturing ``spec``."""
        return GraphRunner(self.model, self.attn_backend, spec, self.device, self.dtype,
                           self.hidden_size, self.first_stage, self.sampler)  # fmt: skip

    # ----------------------------------------------------------------- capture
    def capture(
        self,
        kv_caches: list[list[torch.Tensor]],
        scratch_slots: list[int],
        capturer: GraphCapturer | None = None,
        show_progress: bool = True,
    ) -> None:
        """Capture every graph of every VE (see :meth:`GraphSet.capture`); from then on
        :meth:`plan` replays what fits.

        Args:
            kv_caches: kv_caches[ve][local_layer], the final caches.
            scratch_slots: per VE, its scratch slot.
            capturer: graph factory (torch.cuda graphs when None; a fake in CPU tests).
        Raises:
            RuntimeError: when this runner already captured.
        """
        if self.graphs is not None:
            raise RuntimeError("GraphRunner.capture ran twice; build a new runner instead.")
        graphs = GraphSet(self.model, self.attn_backend, self.spec, self.device, self.dtype,
                          self.hidden_size, self.first_stage, self.sampler,
                          capturer or GraphCapturer())  # fmt: skip
        graphs.capture(kv_caches, scratch_slots, show_progress)
        self.graphs = graphs

    @property
    def capture_seconds(self) -> float:
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    @property
    def capture_bytes(self) -> int:
        """Device memory the capture took (0 before or without one)."""
        return self.graphs.capture_bytes if self.graphs is not None else 0

    def captured_sizes(self, virtual_engine: int, kind: str = "decode") -> list[int]:
        """Sorted captured sizes of ``virtual_engine``: ``kind`` "decode" (rows), "prefill"
        (tokens), "loop" (rows of decode-loop graphs) or "piecewise" (tokens); [] before
        capture."""
        if self.graphs is None:
            return []
        table = {"decode": self.graphs.graph_runners, "prefill": self.graphs.prefill_graphs,
                 "loop": self.graphs.loops, "piecewise": self.graphs.piecewise}[kind]  # fmt: skip
        return sorted(table[virtual_engine])

    # ---------------------------------------------------------------- planning
    def _use_captured_graph(
        self, virtual_engine: int, batch_size: int, max_decode_seq_len: int
    ) -> bool:
        """True when a decode batch of ``batch_size`` rows whose longest context (lookahead
        slots included) is ``max_decode_seq_len`` can replay a graph of this VE: its padded
        size was captured for this VE and the context fits ``max_seq_len_to_capture``."""
        padded = self.sizes.padded_size(batch_size)
        if padded is None or padded not in self.graphs.graph_runners[virtual_engine]:
            return False
        return max_decode_seq_len <= self.max_seq_len_to_capture

    def plan(
        self,
        virtual_engine: int,
        mode: ForwardMode,
        rows: int,
        tokens: int,
        max_len: int = 0,
        pad_eager: bool = False,
        has_context: bool = False,
    ) -> Plan:
        """How a step of ``rows`` sequences and ``tokens`` new tokens runs on VE
        ``virtual_engine``.

        Decode (``max_len``: the longest context, lookahead slots included): a graph when
        its padded size was captured for the VE and ``max_len`` fits
        ``max_seq_len_to_capture``, else eager ("too_big" / "too_long"). Prefill: a prefill
        graph for one sequence up to the largest captured token count, else eager
        ("prefill"); a prefill with cached context (``has_context``) never replays one.
        Mixed (chunked prefill with decode rows) and prefill steps no prefill graph serves:
        piecewise graphs when ``tokens`` fits a captured piecewise size, else eager
        ("mixed" / "prefill"). Before capture every step is eager ("enforce_eager" for
        decode), padded like a graph only with ``pad_eager`` (a debug switch: padded eager
        steps run the graphs' shapes, so the two agree exactly).
        """
        if mode == ForwardMode.MIXED:
            return self._plan_pieces(virtual_engine, tokens, pad_eager, "mixed")
        if mode == ForwardMode.DECODE:
            if self.graphs is None:
                padded = self.sizes.padded_size(rows) if pad_eager else None
                return Plan(padded or 0, None, "enforce_eager")
            if self._use_captured_graph(virtual_engine, rows, max_len):
                size = self.sizes.padded_size(rows) or rows
                return Plan(size, size, None)
            padded = self.sizes.padded_size(rows)
            if padded is None or padded not in self.graphs.graph_runners[virtual_engine]:
                return Plan(0, None, "too_big")
            return Plan(0, None, "too_long")
        if rows == 1 and not has_context and (self.graphs is not None or pad_eager):
            size = next_size(self.spec.prefill_sizes, tokens)
            if self.graphs is None and size is not None:
                return Plan(size, None, "prefill")
            if size is not None and size in self.graphs.prefill_graphs[virtual_engine]:
                return Plan(size, size, None)
        return self._plan_pieces(virtual_engine, tokens, pad_eager, "prefill")

    def _plan_pieces(self, virtual_engine: int, tokens: int, pad_eager: bool, reason: str) -> Plan:
        """A step of ``tokens`` tokens with prefill rows: piecewise replay at the smallest
        captured piecewise size >= ``tokens``, else eager for ``reason`` (padded to that
        size and run as pieces under ``pad_eager`` before capture)."""
        size = next_size(self.spec.piecewise_sizes, tokens)
        if size is None:
            return Plan(0, None, reason)
        if self.graphs is None:
            pieces = pad_eager and hasattr(self.model, "piecewise_model")
            return Plan(size, None, reason, piecewise=True) if pieces else Plan(0, None, reason)
        if size in self.graphs.piecewise[virtual_engine]:
            return Plan(size, size, None, piecewise=True)
        return Plan(0, None, reason)

    # ----------------------------------------------------------------- running
    def run(
        self,
        batch: ForwardBatch,
        kv_caches: list[torch.Tensor],
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> Any:
        """The model forward of one step as planned (graph replay or eager), counted.

        Args:
            batch: a batch prepared with this runner's :class:`Plan`.
            kv_caches: the VE's caches, one per local layer (the eager path reads them;
                a graph baked them in).
            intermediate_tensors: received from the previous stage (not on stage 0).
        Returns:
            hidden states [num_tokens, hidden] on the last stage, else IntermediateTensors
            (a replay returns the graph's static output, valid until the next replay).
        """
        ve, size = batch.virtual_engine, batch.graph_size
        if batch.piecewise:
            return self._run_pieces(batch, kv_caches, intermediate_tensors)
        if size is None:
            self.counters.count_eager(ve, batch.eager_reason)
            return self.model(batch.input_ids, batch.positions, kv_caches,
                              batch.attn_metadata, intermediate_tensors)  # fmt: skip
        prefill = batch.mode == ForwardMode.PREFILL
        graphs = self.graphs
        cg = (graphs.prefill_graphs if prefill else graphs.graph_runners)[ve][size]
        graphs.stage_inputs(ve, size, batch.input_ids, batch.positions, batch.step,
                            cg.attn_metadata, intermediate_tensors)  # fmt: skip
        cg.graph.replay()
        if prefill:
            self.counters.count_prefill_replay(ve, size)
        else:
            self.counters.count_replay(ve, size)
        return cg.output

    def _run_pieces(
        self,
        batch: ForwardBatch,
        kv_caches: list[torch.Tensor],
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        """A step planned as pieces: replayed (``graph_size`` set) or run eagerly at its
        padded size (the eager padding switch). Returns its first T rows, T = the step's
        real tokens (hidden states [T, hidden] or IntermediateTensors)."""
        ve, size, n = batch.virtual_engine, batch.graph_size, batch.num_tokens
        t = len(batch.step.slot_mapping)
        pm = self.model.piecewise_model
        if size is None:
            if self._eager_piece_buffers is None:
                self._eager_piece_buffers = PieceBuffers(
                    self.spec.piecewise_sizes[-1], pm.piece_widths(), self.hidden_size,
                    self.dtype, self.device,
                )  # fmt: skip
            bufs = self._eager_piece_buffers
            calls = piece_fns(pm, bufs, len(kv_caches), batch.input_ids, intermediate_tensors)
            positions = batch.positions[:t]
            self.counters.count_eager(ve, batch.eager_reason)
        else:
            graphs = self.graphs
            graphs.stage_piece_inputs(ve, size, batch.input_ids, batch.positions,
                                      intermediate_tensors)  # fmt: skip
            bufs = graphs.piece_buffers[ve]
            calls = graphs.piecewise[ve][size].calls
            positions = graphs.inputs[ve].positions[:t]
            self.counters.count_piecewise_replay(ve, size)
        out = run_pieces(pm, calls, bufs, positions, kv_caches, batch.attn_metadata)
        if isinstance(out, IntermediateTensors):
            return IntermediateTensors({k: v[:t] for k, v in out.items()})
        return out[:t] if t < n else out  # [T, hidden]

    def run_loop(self, batch: ForwardBatch, n: int) -> torch.Tensor | None:
        """Run ``n`` decode steps of ``batch`` in its decode-loop graph, or return None when
        none serves it (no graph planned, sampling not greedy-only, or no loop graph of its
        size; the caller then takes the per-step path).

        Step 0's inputs (padded to the graph's rows) are uploaded once, the graph replays
        ``n`` times (each counted as a replay of its size). Returns the real rows of the
        ring's first ``n`` steps, [n, real rows, 3] float64 on the device (token id,
        logprob, rank; the caller makes the one read).

        Raises:
            ValueError: ``n`` outside [1, the ring's rows] (the ``max_steps`` it was
                captured with).
        """
        size = batch.graph_size
        if size is None or not eligible(batch.sampling_metadata):
            return None
        ve = batch.virtual_engine
        loop = self.graphs.loops[ve].get(size)
        if loop is None:
            return None
        if not 0 < n <= loop.ring.shape[0]:  # the ring's rows bound the replays of one call
            raise ValueError(f"{n} loop steps outside [1, {loop.ring.shape[0]}] (the ring's rows)")
        self.graphs.stage_inputs(ve, size, batch.input_ids, batch.positions, batch.step,
                                 loop.attn_metadata, loop_steps=n)  # fmt: skip
        loop.counter.zero_()
        for _ in range(n):
            loop.graph.replay()
            self.counters.count_replay(ve, size)
        return loop.ring[:n, : batch.num_real_rows]

    def staged_event(self, virtual_engine: int) -> Any:
        """The CUDA event recorded after the last replay of ``virtual_engine`` queued its
        input uploads (None before any CUDA replay, or without graphs): once it completes,
        the host may reuse staging buffers (multi-step decoding waits on it before planning
        the next step)."""
        return self.graphs.staged_event(virtual_engine) if self.graphs is not None else None
