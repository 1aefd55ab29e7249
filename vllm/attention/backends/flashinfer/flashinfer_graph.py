"""FLASHINFER's CUDA-graph state: one virtual engine's buffers and per-size decode wrappers.

Graph state per virtual engine (docs/design.md guarantee 1): ``paged_kv_indptr`` [max_bs + 1],
``paged_kv_indices`` [max_bs x max_blocks], ``paged_kv_last_page_len`` [max_bs] (int32) and
``slot_rows`` [3, max_bs] (int64), allocated once at ``max_batchsize_to_capture`` (the float
workspace is the backend's shared one). Each captured size gets its own decode wrapper over
views ``indptr[:bs + 1]`` and ``last_page_len[:bs]``, so its batch size is fixed to ``bs``
and no later capture can shrink it; a model with sliding windows gets one more wrapper per
distinct window for each size, over the same views, planned at each replay with its
``window_left``. A size's plain graph and its decode-loop graph share those wrappers; a
loop call is planned once, for its last step (:mod:`.loop_plan`, ``prepare_loop``), and
``advance`` moves lengths and slots on the device. Padded lanes read one token of the
scratch block.
Sizes up to the small-decode limit run the Triton kernel instead (no wrapper, no plan): they
take views of :class:`~.small_decode.SmallDecodeGraphBuffers`, which a decode-loop graph
can advance on the device. Prefill graphs (one sequence, :mod:`.flashinfer_prefill`) take
views ``prefill_rows[:, :tokens]`` of a [3, max prefill tokens] int64 buffer of their own.

The state is created by the backend (``FlashInferBackend.make_graph_state``) and reaches it
through the instance it is given, so this module does not import the backend module.
"""

from __future__ import annotations

import torch

from vllm.attention.backends.abstract import (
    AttentionBackend,
    AttentionGraphState,
    AttentionMetadata,
    ForwardMode,
    StepInputs,
)
from vllm.attention.backends.flashinfer.flashinfer_prefill import graph_prefill_metadata
from vllm.attention.backends.flashinfer.loop_plan import (
    advance_paged,
    first_page_lens,
    lengthened,
)
from vllm.attention.backends.flashinfer.metadata import FlashInferMetadata
from vllm.attention.backends.flashinfer.paged_cache import (
    paged_kv_host,
    plan_paged,
    slot_rows_host,
)
from vllm.attention.backends.flashinfer.small_decode import (
    SmallDecodeGraphBuffers,
    SmallDecodeMetadata,
)
from vllm.utils import pin_for


class FlashInferGraphState(AttentionGraphState):
    """One VE's FlashInfer CUDA-graph buffers and per-size decode wrappers.

    Args:
        backend: the ``FlashInferBackend`` that owns this state (its wrapper classes,
            workspace, plan arguments, small-decode buffers and run counters are used).
        scratch_slot: this VE's scratch slot.
    """

    def __init__(self, backend: AttentionBackend, scratch_slot: int):
        super().__init__(backend.spec, scratch_slot)
        self.backend = backend
        self.captured: dict[int, FlashInferMetadata] = {}  # per size, see _new_metadata

    def allocate(self, max_bs: int) -> None:
        d = self.spec.device
        self.max_bs = max_bs
        self.paged_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=d)
        self.paged_kv_indices = torch.zeros(
            max_bs * self.spec.max_blocks_per_seq, dtype=torch.int32, device=d
        )
        self.paged_kv_last_page_len = torch.zeros(max_bs, dtype=torch.int32, device=d)
        # [slot | key row | value row] per lane, filled per replay by one upload
        self.slot_rows = torch.zeros(3, max_bs, dtype=torch.long, device=d)
        small_rows = min(max_bs, self.backend.small_max_rows)
        self.small = None
        if small_rows > 0:
            self.small = SmallDecodeGraphBuffers(self.backend.small(), small_rows,
                                                 self.scratch_slot)  # fmt: skip

    def allocate_prefill(self, max_tokens: int) -> None:
        # [slot | key row | value row] per token of a graph prefill, one upload per replay
        self.prefill_rows = torch.zeros(3, max_tokens, dtype=torch.long, device=self.spec.device)

    def prefill_metadata_for_capture(self, tokens: int) -> AttentionMetadata:
        if tokens > self.prefill_rows.shape[1]:
            raise ValueError(
                f"prefill capture size {tokens} exceeds the allocated maximum "
                f"{self.prefill_rows.shape[1]}."
            )
        md = graph_prefill_metadata(self.prefill_rows[:, :tokens], self.scratch_slot)
        self.prepare_prefill_replay(tokens, StepInputs.padded_prefill(tokens), md)
        return md

    def prepare_prefill_replay(
        self, tokens: int, step: StepInputs, metadata: AttentionMetadata
    ) -> None:
        rows = slot_rows_host(step.slot_mapping, self.scratch_slot, self.spec.block_size)
        self.prefill_rows[:, :tokens].copy_(pin_for(rows, self.spec.device), non_blocking=True)
        self.backend.graph_prefill_runs += 1

    def advances_on_device(self, metadata: AttentionMetadata) -> bool:
        if isinstance(metadata, SmallDecodeMetadata):
            return True
        return self.backend.loops_over_wrappers  # planned once per call (.loop_plan)

    def advance(self, metadata: AttentionMetadata, positions: torch.Tensor) -> None:
        if isinstance(metadata, SmallDecodeMetadata):
            SmallDecodeGraphBuffers.advance(metadata)
            return
        bs = metadata.num_rows
        indptr, indices, last = self._views(bs)
        advance_paged(indptr, indices, last, self.slot_rows[:, :bs], positions,
                      self.scratch_slot, self.spec.block_size)  # fmt: skip

    def prepare_loop(
        self, bs: int, step: StepInputs, metadata: AttentionMetadata, steps: int
    ) -> None:
        if isinstance(metadata, SmallDecodeMetadata) or steps <= 1:
            self.prepare_replay(bs, step, metadata)
            return
        # plan the call's last step; the kernels read each step's lengths on the device
        last = self._plan(lengthened(step, steps - 1, self.spec.block_size),
                          metadata)  # [bs] int32 host  # fmt: skip
        first = first_page_lens(last, step.num_real_rows, steps - 1)  # [bs] int32 host
        self.paged_kv_last_page_len[:bs].copy_(pin_for(first, self.spec.device),
                                               non_blocking=True)  # fmt: skip
        self._upload_slots(bs, step)
        self.backend.decode_runs += 1

    def _views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This size's own views; the full-size handles are never rebound."""
        return (
            self.paged_kv_indptr[: bs + 1],
            self.paged_kv_indices,
            self.paged_kv_last_page_len[:bs],
        )

    def metadata_for_capture(self, bs: int) -> AttentionMetadata:
        if bs > self.max_bs:
            raise ValueError(f"capture size {bs} exceeds the allocated maximum {self.max_bs}.")
        if self.backend.takes_small_path(ForwardMode.DECODE, bs):
            return self.small.metadata(bs)
        md = self.captured.get(bs)
        if md is None:
            md = self.captured[bs] = self._new_metadata(bs)
        self.prepare_replay(
            bs, StepInputs.padded_decode(bs), md
        )  # every lane reads one scratch token
        return md

    def _new_metadata(self, bs: int) -> FlashInferMetadata:
        """Size ``bs``'s decode wrappers (one per window) over this size's views: the
        plain graph and the decode-loop graph of the size share them (each replay plans
        first), so each size holds FlashInfer's 8 MiB integer workspaces once."""
        indptr, indices, last = self._views(bs)
        by_window = {
            w: self.backend.decode_wrapper_cls(
                self.backend.workspace(),  # shared, see FlashInferBackend.workspace
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.backend.tensor_cores,
                paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last,
            )
            for w in (None, *self.backend.windows)
        }
        wrapper = by_window.pop(None)
        return FlashInferMetadata(
            mode=ForwardMode.DECODE,
            num_rows=bs,
            num_tokens=bs,
            slot_mapping=self.slot_rows[0, :bs],
            scratch_slot=self.scratch_slot,
            wrapper=wrapper,
            kv_rows=self.slot_rows[1:, :bs],
            window_wrappers=by_window,
        )

    def prepare_replay(self, bs: int, step: StepInputs, metadata: AttentionMetadata) -> None:
        if isinstance(metadata, SmallDecodeMetadata):
            self.small.prepare(bs, step)
            self.backend.small_decode_runs += 1
            return
        self._plan(step, metadata)
        self._upload_slots(bs, step)
        self.backend.decode_runs += 1

    def _plan(self, step: StepInputs, metadata: AttentionMetadata) -> torch.Tensor:
        """Plan the wrappers behind ``metadata`` over ``step``'s page tables (which fill
        this size's indptr / indices / last_page_len views); returns the host
        ``last_page_len`` [rows] int32 it planned with."""
        md: FlashInferMetadata = metadata  # type: ignore[assignment]
        indptr, indices, last = paged_kv_host(
            step, self.spec.block_size, self.scratch_block, self.spec.max_blocks_per_seq
        )
        # Indices go up here, asynchronously: FlashInfer copies a HOST indices tensor into
        # its graph buffer with a blocking copy (a stream sync per plan, which would stop
        # multi-step decoding from running ahead of the GPU); from a device tensor the
        # copy is asynchronous. indptr / last_page_len must stay on the host (planning).
        indices = indices.to(self.spec.device, non_blocking=True)  # [pages] int32
        # every window's wrapper plans the same tables into the same buffers (its own
        # plan info: window_left is fixed at plan time)
        for window, wrapper in [(None, md.wrapper), *(md.window_wrappers or {}).items()]:
            kw = self.backend.plan_kwargs(window)
            plan_paged(wrapper, kw, self.spec.head_size, indptr, indices, last)
        return last

    def _upload_slots(self, bs: int, step: StepInputs) -> None:
        """``step``'s slot, key row and value row per lane into this size's view."""
        rows = slot_rows_host(step.slot_mapping, self.scratch_slot, self.spec.block_size)
        self.slot_rows[:, :bs].copy_(pin_for(rows, self.spec.device), non_blocking=True)
