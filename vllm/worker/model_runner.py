"""ModelRunner: input preparation and the forward pass of one pipeline stage.

Input preparation (``prepare_model_input``) is plain host work over the scheduled groups;
padding a decode batch to a captured size is one step of it and works eagerly too
(``pad_eager_batches``, a debug switch). Execution runs the model eagerly here; CUDA-graph
capture and replay live in :mod:`vllm.worker.graph_runner`, which this class delegates to.
"""

from __future__ import annotations

import logging
import time

import torch

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.attention.selector import get_attn_backend, which_attn_backend
from vllm.config import EngineConfig
from vllm.model_executor.layers.sampler import Sampler
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sequence import IntermediateTensors, SamplerOutput, SequenceGroupMetadata
from vllm.worker.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

PAD_SLOT_ID = -1


class ModelRunner:
    """Prepares inputs and runs the model of pipeline stage ``pp_rank`` of ``pp_size``.

    Args:
        config: the engine config.
        device: the torch device of this worker.
        pp_rank, pp_size: this stage and the number of stages.
    """

    def __init__(
        self, config: EngineConfig, device: torch.device, pp_rank: int = 0, pp_size: int = 1
    ):
        self.config = config
        self.model_config = config.model_config
        self.device = device
        self.pp_rank = pp_rank
        self.pp_size = pp_size
        self.block_size = config.cache_config.block_size
        self.dtype = self.model_config.torch_dtype
        self.attn_backend_name = which_attn_backend(device.type, self.dtype)
        self.attn_backend = get_attn_backend(self.attn_backend_name)
        self.sampler = Sampler()
        self.generators: dict[int, torch.Generator] = {}
        self.pad_eager_batches = False
        self.model = None
        # Filled by the graph runner; empty means every step runs eagerly.
        self.graph_runner = None

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def load_model(self) -> None:
        """Build the model for this stage and load its weights."""
        from vllm.model_executor.model_loader import get_model

        t0 = time.perf_counter()
        self.model = get_model(self.model_config, self.device, self.pp_rank, self.pp_size)
        logger.info(
            "Loaded %s (stage %d/%d) in %.1f s; attention backend %s",
            self.model_config.model,
            self.pp_rank,
            self.pp_size,
            time.perf_counter() - t0,
            self.attn_backend_name,
        )

    @property
    def num_local_layers(self) -> int:
        return self.model.end_layer - self.model.start_layer

    # ------------------------------------------------------------------ inputs
    def padded_batch_size(self, batch_size: int, mode: ForwardMode) -> int:
        """Rows after padding: the smallest captured size >= batch_size for a decode step
        that may replay a graph, or batch_size itself (eager, or prefill)."""
        if mode != ForwardMode.DECODE:
            return batch_size
        if self.graph_runner is not None:
            return self.graph_runner.padded_size(batch_size)
        return batch_size

    def prepare_model_input(
        self,
        seq_group_metadata_list: list[SequenceGroupMetadata],
        virtual_engine: int,
        scratch_slot: int,
        num_lookahead_slots: int = 0,
    ) -> ForwardBatch:
        """Flatten the scheduled groups into one :class:`ForwardBatch`.

        Prefill rows feed every token of the sequence (prompt, plus outputs when a
        preempted sequence is recomputed); decode rows feed the last token at position
        len - 1. Raises ValueError on a mixed prefill/decode list (never scheduled).
        """
        if not seq_group_metadata_list:
            raise ValueError("prepare_model_input needs at least one scheduled group.")
        is_prompt = seq_group_metadata_list[0].is_prompt
        if any(m.is_prompt != is_prompt for m in seq_group_metadata_list):
            raise ValueError("a step mixes prefill and decode groups (chunked prefill is off).")
        mode = ForwardMode.PREFILL if is_prompt else ForwardMode.DECODE
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_lens: list[int] = []
        tables: list[list[int]] = []
        max_decode_len = 0
        for md in seq_group_metadata_list:
            for seq_id, data in md.seq_data.items():
                table = md.block_tables[seq_id]
                n = data.get_len()
                if is_prompt:
                    toks = data.get_token_ids()
                    pos = list(range(n))
                else:
                    toks = [data.get_last_token_id()]
                    pos = [n - 1]
                    max_decode_len = max(max_decode_len, n + num_lookahead_slots)
                input_ids.extend(toks)
                positions.extend(pos)
                slots.extend(table[p // bs] * bs + p % bs for p in pos)
                seq_lens.append(n)
                query_lens.append(len(toks))
                tables.append(table)
        real_rows = len(seq_lens)
        batch_size = self.padded_batch_size(real_rows, mode)
        if mode == ForwardMode.DECODE and self.pad_eager_batches and self.graph_runner is None:
            batch_size = self.debug_pad_size(real_rows)
        for _ in range(batch_size - real_rows):  # padded lanes (decode only)
            input_ids.append(0)
            positions.append(0)
            slots.append(PAD_SLOT_ID)
            seq_lens.append(0)
            query_lens.append(1)
            tables.append([])
        step = StepInputs(mode, seq_lens, query_lens, tables, slots, real_rows)
        attn_metadata = self.attn_backend.build_metadata(step, self.device, bs, scratch_slot)
        sm = None
        if self.is_last_stage:
            sm = SamplingMetadata.build(
                seq_group_metadata_list,
                query_lens[:real_rows],
                self.model_config.vocab_size,
                self.device,
                self.generators,
            )
        return ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(input_ids, dtype=torch.long).to(self.device),
            positions=torch.tensor(positions, dtype=torch.long).to(self.device),
            attn_metadata=attn_metadata,
            step=step,
            sampling_metadata=sm,
            virtual_engine=virtual_engine,
            num_real_rows=real_rows,
            batch_size=batch_size,
            max_decode_seq_len=max_decode_len,
        )

    @staticmethod
    def debug_pad_size(rows: int) -> int:
        """Eager padding target used by the debug switch: the next power of two."""
        size = 1
        while size < rows:
            size *= 2
        return size

    def free_finished(self, request_seq_ids: list[int]) -> None:
        """Drop per-sequence state (seeded generators) of finished sequences."""
        for seq_id in request_seq_ids:
            self.generators.pop(seq_id, None)

    # ---------------------------------------------------------------- execute
    @torch.inference_mode()
    def execute_model(
        self,
        batch: ForwardBatch,
        kv_caches: list[torch.Tensor],
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> SamplerOutput | IntermediateTensors:
        """Run one step of this stage.

        Args:
            batch: from :meth:`prepare_model_input`.
            kv_caches: this VE's caches, one per local layer.
            intermediate_tensors: received from the previous stage (not on stage 0).
        Returns:
            SamplerOutput on the last stage, else IntermediateTensors for the next stage.
        """
        if self.graph_runner is not None and self.graph_runner.can_replay(batch):
            hidden = self.graph_runner.replay(batch, kv_caches, intermediate_tensors)
        else:
            if self.graph_runner is not None:
                self.graph_runner.count_eager(batch)
            hidden = self.model(
                batch.input_ids,
                batch.positions,
                kv_caches,
                batch.attn_metadata,
                intermediate_tensors,
            )
        if not self.is_last_stage:
            return hidden
        sm = batch.sampling_metadata
        selected = hidden[sm.selected_token_indices]  # [num_rows, hidden]
        logits = self.model.compute_logits(selected).float()  # [num_rows, vocab]
        return self.sampler(logits, sm)

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, num_seqs: int) -> None:
        """One prefill forward of ``num_tokens`` tokens over ``num_seqs`` sequences with
        empty caches (nothing is written), to measure peak activation memory."""
        per = max(1, num_tokens // num_seqs)
        lens = [per] * num_seqs
        lens[-1] += num_tokens - per * num_seqs
        step = StepInputs(
            ForwardMode.PREFILL, lens, lens, [[] for _ in lens], [0] * num_tokens, num_seqs
        )
        md = self.attn_backend.build_metadata(step, self.device, self.block_size, 0)
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        empty = [torch.empty(0, device=self.device, dtype=self.dtype)] * self.num_local_layers
        inter = None
        if not self.is_first_stage:
            h = self.model_config.hf_config.hidden_size
            z = torch.zeros(num_tokens, h, dtype=self.dtype, device=self.device)
            inter = IntermediateTensors({"hidden_states": z, "residual": z.clone()})
        out = self.model(ids, pos, empty, md, inter)
        if self.is_last_stage:
            self.model.compute_logits(out[-num_seqs:]).float()
