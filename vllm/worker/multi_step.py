"""Multi-step decoding (upstream V0's ``--num-scheduler-steps N``): up to N decode forward
passes per scheduler call, with one device-to-host read at the end instead of one per step.

Why: a small model's decode step is short on the GPU (SmolLM2-135M: about a millisecond),
and a one-token step spends as long again on the host (scheduling, input preparation,
waiting for the sampled ids, detokenizing, stop checks) while the GPU idles. Here the
sampled ids of step i feed step i + 1 on the device, and the host prepares step i + 1 while
the device runs step i, so the host's per-token work leaves the GPU's critical path.

One call (:func:`execute_multi_step`):

1. ``n`` = :func:`decode_steps`: at most N, no more than the largest number of tokens any
   sequence of the batch still wants (``max_tokens``), never past ``max_model_len`` for any
   sequence.
2. Step 0's inputs come from ``ModelRunner.prepare_model_input`` with ``n - 1`` lookahead
   slots, so the graph gate sees the longest context the call reaches and every step of the
   call takes the same path (the same captured size, or eager). The scheduler reserved
   ``N - 1`` lookahead KV slots per sequence, so the block tables already cover all steps.
3. Each step: forward (replayed or eager, counted as usual), logits of the real rows,
   sampling on the device (``Sampler.sample_on_device``); the ids are copied, on the device,
   into the next step's input ids; the host builds the next step's positions, slots
   (``seq_len + 1``, slot from the block table) and attention metadata. Penalties read the
   output tokens so far: each step's ids are appended on the device to the penalty inputs
   (:class:`_PenaltyState`), and a ``min_tokens`` mask row is cleared at the step where its
   sequence reaches ``min_tokens``, exactly as one-token steps rebuild them.
4. Before it builds step i + 1, the host waits until the device has consumed step i's
   uploads (an event recorded right after they were queued): attention backends may reuse
   pinned staging buffers between plans (FlashInfer's planner does). The device is then
   already running step i, so host and device overlap.
5. One read of every step's packed sample rows; each sequence's tokens, in step order, are
   its ``SequenceOutput.token_ids``, which the engine appends with stop checks (nothing
   after a stop is kept; the extra device work of a finished sequence is wasted).

Greedy results equal N one-token steps exactly (tests/worker/test_multi_step.py); seeded
sampling draws from the same per-sequence generators in the same order.

A greedy call padded to a size with a decode-loop graph skips steps 3-4:
the graph advances itself on the device (vllm/cudagraph/decode_loop.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.attention.backends.host_tables import step_tables
from vllm.distributed.tp_ops import tensor_model_parallel_broadcast
from vllm.forward_context import deferred_host_read
from vllm.model_executor.forward_batch import ForwardBatch
from vllm.model_executor.layers.sampler import sampler_output
from vllm.sequence import SamplerOutput, SequenceGroupMetadata
from vllm.utils import to_device
from vllm.worker.model_input import place_input

if TYPE_CHECKING:
    from vllm.model_executor.sampling_metadata import PenaltyTensors
    from vllm.worker.model_runner import ModelRunner


def decode_steps(
    metadata_list: list[SequenceGroupMetadata], max_steps: int, max_model_len: int
) -> int:
    """Decode steps one call runs for this batch.

    ``min(max_steps, min over sequences of (max_model_len - len), max over sequences of
    tokens still wanted)``, at least 1. Lengths count prompt and output tokens. One step
    when a request has a bad word of several tokens: which token it bans depends on the
    previous step's token, and a call's steps share one bias row.
    """
    room = max_steps
    wanted = 1
    for md in metadata_list:
        if any(len(s) > 1 for s in md.sampling_params.bad_words_token_ids):
            return 1
        max_tokens = md.sampling_params.max_tokens
        for data in md.seq_data.values():
            n = data.get_len()
            room = min(room, max_model_len - n)
            left = (max_model_len - n) if max_tokens is None else max_tokens - data.get_output_len()
            wanted = max(wanted, left)
    return max(1, min(room, wanted))


def _next_step(step: StepInputs, block_size: int) -> tuple[StepInputs, list[int]]:
    """The decode StepInputs one token later, and its positions [batch rows].

    Real rows grow by one token; the new token's slot comes from the (lookahead-covered)
    block table, read from the call's flattened tables (``host_tables.step_tables``, which
    the next step inherits). Padded lanes keep length 0, slot -1 and position 0.

    Raises:
        IndexError: a real row's table does not reach the new token (the scheduler did not
            reserve the call's lookahead blocks).
    """
    real = step.num_real_rows
    pad = len(step.seq_lens) - real
    ft = step_tables(step)
    old = np.fromiter(step.seq_lens, dtype=np.int64, count=real)  # [real] new positions
    col = old // block_size  # [real] the new token's block in its row's table
    r = ft.first_short(col + 1)  # a table that ends before that block
    if r >= 0:
        raise IndexError(
            f"row {r} needs block {int(col[r])} of its table for position {int(old[r])}, "
            f"but the table has {int(ft.lens[r])} blocks (lookahead not reserved)."
        )
    slots = ft.flat[ft.starts[:real] + col] * block_size + old % block_size  # [real]
    positions = old.tolist()
    nxt = StepInputs(
        ForwardMode.DECODE, (old + 1).tolist() + [0] * pad, step.query_lens,
        step.block_tables, slots.tolist() + [-1] * pad, real,
    )  # fmt: skip
    nxt.flat_tables = ft  # the same tables: flattened once per call
    return nxt, positions + [0] * pad


class _PenaltyState:
    """Keeps a multi-step call's penalty inputs (SamplingMetadata.penalties) current.

    Args:
        pen: the PenaltyTensors built for step 0 (modified in place between steps).
        metadata_list: the scheduled groups, whose sequences are the sample rows in order.
        device: where the rows to clear are uploaded.
    """

    def __init__(
        self, pen: PenaltyTensors, metadata_list: list[SequenceGroupMetadata], device: torch.device
    ):
        self.pen = pen
        self.device = device
        # per step i >= 1, the rows whose min_tokens mask ends there (out_len + i == min)
        self.clear_at: dict[int, list[int]] = {}
        if pen.min_tokens_mask is None:
            return
        row = 0
        for md in metadata_list:
            min_tokens = md.sampling_params.min_tokens
            for data in md.seq_data.values():
                step = min_tokens - data.get_output_len()
                if step >= 1:
                    self.clear_at.setdefault(step, []).append(row)
                row += 1

    def after_step(self, i: int, ids: torch.Tensor) -> None:
        """Step ``i``'s ids [rows] int64 (device) are output tokens from step i + 1 on."""
        pen = self.pen
        pen.output_tokens = torch.cat([pen.output_tokens, ids[:, None]], dim=1)
        rows = self.clear_at.get(i + 1)
        if rows:
            idx = to_device(torch.tensor(rows, dtype=torch.long), self.device)  # [k]
            pen.min_tokens_mask[idx] = False


def _advance(
    runner: ModelRunner, batch: ForwardBatch, next_ids: torch.Tensor, scratch_slot: int
) -> ForwardBatch:
    """``batch`` one token later, fed by ``next_ids`` [batch_size] int64 (device)."""
    step, positions = _next_step(batch.step, runner.block_size)
    md = None
    if batch.graph_size is None:
        md = runner.attn_backend.build_metadata(step, scratch_slot)
    pos = place_input(positions, batch.graph_size, runner.device)  # [batch_size]
    return dataclasses.replace(
        batch, input_ids=next_ids, positions=pos, attn_metadata=md, step=step
    )


def execute_multi_step(
    runner: ModelRunner,
    metadata_list: list[SequenceGroupMetadata],
    virtual_engine: int,
    scratch_slot: int,
    kv_caches: list[torch.Tensor],
    max_steps: int,
    before_read: Callable[[], None] | None = None,
    check_plan: Callable[[ForwardBatch], None] | None = None,
) -> SamplerOutput | None:
    """Run up to ``max_steps`` decode steps of one scheduled decode batch (PP = 1).

    With tensor parallelism every rank runs this with the same metadata (so the same steps
    and plan); the logits are gathered on TP rank 0, which samples, and its ids are
    broadcast to the other ranks for the next pass (no decode-loop graphs at TP > 1).

    Args:
        runner: the ModelRunner (last and only stage).
        metadata_list: the scheduled decode groups (lookahead slots already reserved).
        virtual_engine, scratch_slot, kv_caches: as for a one-token step.
        max_steps: num_scheduler_steps.
        before_read: called once the first pass (or the decode-loop graph) is queued on
            the device, before any device-to-host read (``ExecuteModelRequest.async_callback``).
        check_plan: called with step 0's batch before any pass (the TP ranks' plan
            agreement; every later step of the call takes the same path).
    Returns:
        A SamplerOutput whose samples carry every step's token, in order (``token_ids``);
        None on TP ranks other than 0.
    """
    n = decode_steps(metadata_list, max_steps, runner.model_config.max_model_len)
    batch = runner.prepare_model_input(metadata_list, virtual_engine, scratch_slot, n - 1)
    if check_plan is not None:
        check_plan(batch)
    sm = batch.sampling_metadata
    # the whole call in one decode-loop graph when one serves it (vllm/cudagraph/decode_loop.py)
    ring = runner.graph_runner.run_loop(batch, n)
    if ring is not None:
        if before_read is not None:
            before_read()
        return sampler_output(sm, ring.cpu().numpy(), 0, {}, ring[-1, :, 0].long())
    pen = None
    if sm.penalties is not None and n > 1:
        pen = _PenaltyState(sm.penalties, metadata_list, runner.device)
    cuda = runner.device.type == "cuda"
    staged = torch.cuda.Event() if cuda else None
    if cuda and batch.graph_size is None:
        staged.record()  # step 0's uploads are queued
    next_ids = torch.zeros(batch.batch_size, dtype=torch.long, device=runner.device)
    packed_steps: list[torch.Tensor] = []
    k = 0
    ids = None
    for i in range(n):
        if i > 0:
            ev = staged
            if batch.graph_size is not None:
                ev = runner.graph_runner.staged_event(virtual_engine)
            if ev is not None:
                ev.synchronize()  # step i-1's uploads were consumed: staging buffers are free
            batch = _advance(runner, batch, next_ids, scratch_slot)
            if cuda and batch.graph_size is None:
                staged.record()
        hidden = runner.forward_hidden(batch, kv_caches)
        with deferred_host_read(i + 1 < n):  # read once, after the last pass
            logits = runner.compute_logits(batch, hidden)  # [num_real_rows, vocab]; TP: rank 0
            if logits is not None:
                ids, packed, k = runner.sampler.sample_on_device(logits, sm)
                packed_steps.append(packed)  # [num_real_rows, 3 + 2k] float64
        if i + 1 < n:
            rows = batch.num_real_rows
            ids = tensor_model_parallel_broadcast(ids, (rows,), torch.long, runner.device)
            next_ids[:rows].copy_(ids)
            if pen is not None and logits is not None:
                pen.after_step(i, ids)
        if i == 0 and before_read is not None:
            before_read()  # overlaps the passes still to come (each waits for its uploads)
    if not packed_steps:  # a TP rank other than 0
        return None
    host = torch.stack(packed_steps).cpu().numpy()  # [n, rows, 3 + 2k]: the one read
    return sampler_output(sm, host, k, {}, ids)
