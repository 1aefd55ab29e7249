"""One pipeline stage's share of a step, or of a round of multi-step calls (PP > 1).

Rounds serve the Ray executor; the mp executor's stages serve the same calls as a stream
(vllm/worker/pp_stream.py), built on this module's passes.

A *call* is one ``ExecuteModelRequest`` of one virtual engine (VE) with ``num_steps``
forward passes, decided once by the engine (vllm/worker/multi_step.py ``decode_steps``)
and sent to every stage. A *round* is the list of calls the engine submits together (one
per VE); every stage runs their passes in the same order, pass by pass across the calls::

    for i in range(max num_steps):      # A0 B0 A1 B1 ... for calls A (VE 0), B (VE 1)
        for call in round:
            if i < call.num_steps: run pass i of call

so while the last stage samples pass i of VE 0, stage 0 already runs pass i of VE 1: the
pipeline stays full without the host between passes. Pass i + 1 of a call needs the ids
sampled by pass i: the last stage sends them (int64 [rows], never logits or hidden
states) straight to stage 0, which feeds them as the next input ids on the device; later
stages advance their own positions and attention metadata (``multi_step._advance``), and
stage 0 advances its own before it waits for the ids. Sends never wait for the receiver
(vllm/distributed/communication.py), which is what makes this order deadlock-free.

Forwards are launched and return at once (a CUDA stream; the simulator's stand-in models
one); the host waits only where it reads a result: when the last stage samples a one-step
call's pass, or a multi-step call's last pass (the passes before it are sampled on the
device and their ids sent on without a read). The last stage keeps its sampling one pass
behind its forwards: A0 launched, B0
launched, A0 sampled (its ids sent), A1 launched, B0 sampled, B1 launched, ... While the
host samples one pass, the device already runs the next, and a call's pass is launched
only after its previous pass was sampled (stage 0 needs those ids to run it).

Plan agreement: before the first pass of a call, stage 0 sends its plan header
[virtual_engine, mode, num_tokens, batch_size, graph_size or -1, num_steps] down the
pipeline; every later stage compares it with its own plan (:func:`check_plan_agreement`)
and raises on any difference, so no two stages replay different graph sizes (or one
replays while another runs eagerly) for one step, and a shape mismatch fails loudly before
the hidden states are received.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.attention.backends.abstract import ForwardMode
from vllm.distributed import communication as comm
from vllm.forward_context import deferred_host_read
from vllm.model_executor.layers.sampler import prompt_logprobs
from vllm.sequence import ExecuteModelRequest
from vllm.worker.multi_step import _advance, _PenaltyState
from vllm.worker.packed_output import PackedSamples

if TYPE_CHECKING:
    from vllm.model_executor.forward_batch import ForwardBatch

HEADER_FIELDS = ("virtual_engine", "mode", "num_tokens", "batch_size", "graph_size", "num_steps")


def plan_header(batch: ForwardBatch, num_steps: int) -> list[int]:
    """The plan of a call as :data:`HEADER_FIELDS` (graph_size -1 when eager)."""
    mode = 0 if batch.mode == ForwardMode.PREFILL else 1
    graph = -1 if batch.graph_size is None else batch.graph_size
    return [batch.virtual_engine, mode, batch.num_tokens, batch.batch_size, graph, num_steps]


def check_plan_agreement(own: list[int], received: list[int], rank: int) -> None:
    """Raise unless this stage's plan equals stage 0's.

    Raises:
        RuntimeError: naming the stage and both plans field by field.
    """
    if list(own) != list(received):
        mine = dict(zip(HEADER_FIELDS, own))
        theirs = dict(zip(HEADER_FIELDS, received))
        raise RuntimeError(
            f"pipeline stage {rank} disagrees with stage 0 on the plan of a step: stage 0 "
            f"planned {theirs}, stage {rank} planned {mine}; every stage of a step must run "
            "the same graph size (or all eagerly) over the same rows."
        )


@dataclass
class _Call:
    """One request's passes on this stage."""

    request: ExecuteModelRequest
    batch: Any
    num_steps: int
    multi: bool  # sampled on the device pass by pass (sample_on_device), read once at the end
    tag: Any = None  # streams: the executor's id of the call, its reply's
    passes_run: int = 0  # streams: passes launched on this stage
    prepared: int = 0  # the pass ``batch`` is built for (advanced ahead of its ids)
    next_ids: torch.Tensor | None = None  # stage 0: [batch_size] int64, the next pass's inputs
    staged: Any = None  # CUDA event: the last eager pass's uploads were queued
    pen: _PenaltyState | None = None
    packed: list = field(default_factory=list)
    k: int = 0
    ids: torch.Tensor | None = None
    output: PackedSamples | None = None


class PipelineStage:
    """Runs rounds of calls on stage ``worker.rank`` of a pipeline (see the module doc).

    Args:
        worker: this stage's ``vllm.worker.worker.Worker`` (model runner, KV caches,
            timings; typed Any: the worker imports this module).
        group: the pipeline group (``vllm.distributed.parallel_state.PPGroup``).
    """

    streaming = False  # rounds; vllm/worker/pp_stream.py streams calls

    def __init__(self, worker: Any, group):
        self.worker = worker
        self.runner = worker.model_runner
        self.rank = worker.rank
        self.group = group
        self.first = group.is_first_rank
        self.last = group.is_last_rank
        self.times = worker.times
        self.multi_step = worker.config.scheduler_config.num_scheduler_steps > 1

    def run(self, requests: list[ExecuteModelRequest]) -> list[PackedSamples] | None:
        """Run a round; the last stage returns one :class:`PackedSamples` per request (in
        order; the executor unpacks them into SamplerOutputs in the engine process,
        vllm/worker/packed_output.py), the others None."""
        self.times.steps += len(requests)
        calls = [self._start(req) for req in requests]
        # Sampling lags one pass behind the forwards on the last stage (module doc).
        pending: list[tuple[_Call, int, Any]] = []  # launched, not yet sampled
        for i in range(max(c.num_steps for c in calls)):
            for call in calls:
                if i >= call.num_steps:
                    continue
                if not self.last:
                    self._forward(call, i)
                    continue
                while any(c is call for c, _, _ in pending):  # its previous pass's ids
                    self._sample(*pending.pop(0))
                pending.append((call, i, self._forward(call, i)))
                if len(pending) > 1:
                    self._sample(*pending.pop(0))
        for entry in pending:
            self._sample(*entry)
        if not self.last:
            return None
        with self.times.phase("sample"):
            return [self._finish(c) for c in calls]

    def _start(self, req: ExecuteModelRequest) -> _Call:
        meta = req.seq_group_metadata_list
        decode = not meta[0].is_prompt
        n = req.num_steps if decode else 1
        multi = decode and self.multi_step
        lookahead = n - 1 if multi else req.num_lookahead_slots
        ce = self.worker.cache_engines[req.virtual_engine]
        with self.times.phase("prepare"):
            batch = self.runner.prepare_model_input(
                meta, req.virtual_engine, ce.scratch_slot, lookahead
            )
        call = _Call(req, batch, n, multi)
        device = self.runner.device
        if self.first and n > 1:
            call.next_ids = torch.zeros(batch.batch_size, dtype=torch.long, device=device)
        if device.type == "cuda" and n > 1:
            call.staged = torch.cuda.Event()
            if batch.graph_size is None:
                call.staged.record()
        sm = batch.sampling_metadata
        if self.last and multi and n > 1 and sm.penalties is not None:
            call.pen = _PenaltyState(sm.penalties, meta, device)
        return call

    def _advance(self, call: _Call, i: int) -> None:
        """Move ``call``'s batch on to pass ``i``. Stage 0 builds the pass's positions and
        attention metadata first (they do not depend on the sampled ids; a stream may
        have built them already, :meth:`_advance_batch`), then receives the ids into the
        input buffer the new batch reads."""
        self._advance_batch(call, i)
        if self.first:
            rows = call.batch.num_real_rows
            with self.times.phase("transfer"):
                got = comm.recv_int_tensor(rows, self.runner.device, self.group.world_size - 1)
            call.next_ids[:rows].copy_(got)  # [rows]: the inputs of the pass about to run

    def _advance_batch(self, call: _Call, i: int) -> None:
        """Build ``call``'s batch for pass ``i`` (once) from the one of pass ``i - 1``."""
        if call.prepared == i:
            return
        call.prepared = i
        batch = call.batch
        ev = call.staged
        if batch.graph_size is not None:
            ev = self.runner.graph_runner.staged_event(batch.virtual_engine)
        if ev is not None:
            ev.synchronize()  # the previous pass's uploads were consumed
        ids = call.next_ids if self.first else batch.input_ids
        ce = self.worker.cache_engines[batch.virtual_engine]
        with self.times.phase("prepare"):
            call.batch = _advance(self.runner, batch, ids, ce.scratch_slot)
        if call.staged is not None and call.batch.graph_size is None:
            call.staged.record()

    def _recv_inter(self, num_tokens: int):
        """The previous stage's hidden states and residual for ``num_tokens`` tokens."""
        cfg = self.worker.config.model_config
        return comm.recv_intermediate_tensors(
            num_tokens, cfg.hf_config.hidden_size, cfg.torch_dtype, self.runner.device,
            self.group.prev_rank,
        )  # fmt: skip

    def _forward(self, call: _Call, i: int, got: list[int] | None = None):
        """Pass ``i`` of ``call`` on this stage up to its forward: receive (plan header,
        hidden states), run the model, send the result on (not the last stage). Returns
        the last stage's hidden states [num_tokens, hidden], else None.

        ``got``: the header of this pass, already received (streams, vllm/worker/
        pp_stream.py, where every pass has one: the plan and the pass index); in rounds
        only a call's first pass has one, received here."""
        if i > 0:
            self._advance(call, i)
        batch = call.batch
        times = self.times
        inter = None
        with times.phase("transfer"):
            own = plan_header(batch, call.num_steps)
            host = self.group.host_group
            if i == 0 and not self.first:
                if got is None:
                    got = comm.recv_header(len(own), self.group.prev_rank, host)
                got = got[: len(own)]
                if got != own:  # take this pass's tensors first: the channel stays in step
                    self._recv_inter(got[HEADER_FIELDS.index("num_tokens")])
                check_plan_agreement(own, got, self.rank)
            if not self.last and (i == 0 or self.streaming):
                head = [*own, i] if self.streaming else own
                comm.send_header(head, self.group.next_rank, host)
            if not self.first:
                inter = self._recv_inter(batch.num_tokens)
        kv = self.worker.cache_engines[batch.virtual_engine].kv_caches
        with times.phase("forward"):
            out = self.runner.forward_hidden(batch, kv, inter)
        times.passes += 1
        if self.last:
            return out
        with times.phase("transfer"):
            comm.send_intermediate_tensors(out, self.group.next_rank)
        return None

    def _sample(self, call: _Call, i: int, hidden: torch.Tensor) -> None:
        """Last stage: logits and sampling of pass ``i`` of ``call``; the ids go back to
        stage 0 when another pass follows."""
        batch = call.batch
        # a multi-step call's ids stay on the device until its last pass (one read)
        deferred = call.multi and i + 1 < call.num_steps
        with self.times.phase("sample"), deferred_host_read(deferred):
            logits = self.runner.compute_logits(batch, hidden)  # [num_real_rows, vocab]
            sm = batch.sampling_metadata
            call.ids, packed, call.k = self.runner.sampler.sample_on_device(logits, sm)
            call.packed.append(packed)  # [num_real_rows, 3 + 2k] float64
            if not call.multi:
                lp = prompt_logprobs(logits, sm)
                call.output = PackedSamples.from_steps(sm, call.packed, call.k, lp)
                return
            if i + 1 < call.num_steps and call.pen is not None:
                call.pen.after_step(i, call.ids)
        if i + 1 < call.num_steps:
            with self.times.phase("transfer"):
                comm.send_int_tensor(call.ids, 0)  # [num_real_rows] to stage 0

    def _finish(self, call: _Call) -> PackedSamples:
        if not call.multi:
            return call.output
        # [n][rows][3 + 2k]: the call's one read
        return PackedSamples.from_steps(call.batch.sampling_metadata, call.packed, call.k)
