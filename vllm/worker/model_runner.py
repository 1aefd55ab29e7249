"""ModelRunner: input preparation and the forward pass of one pipeline stage.

Input preparation (``prepare_model_input``, in :mod:`vllm.worker.model_input`) is plain
host work over the scheduled groups; padding a decode batch or a one-sequence prefill to a
captured size is one step of it and works eagerly too (``pad_eager_batches``, a debug
switch). The :class:`~vllm.cudagraph.runner.GraphRunner` (built with the model) plans each
step during input preparation and runs it (graph replay or eager, counted); with graphs off
it plans every step eagerly. Everything about CUDA graphs lives in :mod:`vllm.cudagraph`.
"""

from __future__ import annotations

import logging
import time

import torch

from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.kv_cache_dtype import distinct_kv_dtype
from vllm.attention.layer import check_layers_match_spec
from vllm.attention.selector import get_attn_backend, which_attn_backend
from vllm.config import EngineConfig
from vllm.cudagraph import DecodeStepCounters, GraphCapturer, GraphRunner, graph_spec
from vllm.cudagraph.memory import estimate_graph_memory
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
from vllm.forward_context import set_forward_context
from vllm.model_executor.forward_batch import ForwardBatch
from vllm.model_executor.layers.sampler import Sampler
from vllm.model_executor.models import attention_fields
from vllm.sequence import (
    CompletionSequenceGroupOutput,
    IntermediateTensors,
    SamplerOutput,
    SequenceGroupMetadata,
)
from vllm.worker import model_input

logger = logging.getLogger(__name__)


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
        self.attn_backend_name = which_attn_backend(
            device.type, self.dtype, self.model_config.head_size,
            config.device_config.attention_backend,
        )  # fmt: skip
        cfg = self.model_config
        tp = config.parallel_config.tensor_parallel_size
        self.attn_spec = AttentionSpec(  # this tensor-parallel rank's heads
            num_heads=cfg.get_num_attention_heads(tp),
            num_kv_heads=cfg.get_num_kv_heads(tp),
            head_size=cfg.head_size,
            block_size=self.block_size,
            dtype=self.dtype,
            device=device,
            max_seq_len_to_capture=config.compilation_config.max_seq_len_to_capture,
            small_decode_max_rows=config.compilation_config.small_decode_max_rows,
            **attention_fields(cfg.hf_config),
            kv_cache_dtype=distinct_kv_dtype(config.cache_config.cache_dtype, self.dtype),
        )
        self.attn_backend = get_attn_backend(self.attn_backend_name)(self.attn_spec)
        self.sampler = Sampler()
        self.generators: dict[int, torch.Generator] = {}
        self.seed_stream = 0  # the generators' random stream (a draft model's: another)
        self.pad_eager_batches = False
        self.model = None
        # The sizes to capture (as if graphs were on: they are also the padding targets of
        # the eager debug switch). Graphs themselves exist only once capture_graphs ran.
        self.graph_spec = graph_spec(config, pp_size, self.attn_backend.supports_prefill_graphs,
                                     self.attn_backend.loop_max_rows())  # fmt: skip
        self.capture_sizes = self.graph_spec.sizes
        self.use_cuda_graph = device.type == "cuda" and not config.compilation_config.enforce_eager
        self.counters = DecodeStepCounters()
        self.graph_runner: GraphRunner | None = None  # built with the model (load_model)
        self.lora = None  # vllm.lora.manager.LoRAManager with enable_lora (load_model)

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
        self.model = get_model(self.model_config, self.device, self.pp_rank, self.pp_size,
                               pooling=self.config.pooler_config is not None)  # fmt: skip
        check_layers_match_spec(self.model, self.attn_spec)
        logger.info(
            "Loaded %s (stage %d/%d) in %.1f s; attention backend %s",
            self.model_config.model,
            self.pp_rank,
            self.pp_size,
            time.perf_counter() - t0,
            self.attn_backend_name,
        )
        self.graph_runner = GraphRunner(
            self.model,
            self.attn_backend,
            self.graph_spec,
            self.device,
            self.dtype,
            self.model_config.hf_config.hidden_size,
            first_stage=self.is_first_stage,
            sampler=self.sampler,
            counters=self.counters,
        )
        if self.config.lora_config is not None:  # before any capture: graphs read the slots
            from vllm.lora.manager import LoRAManager

            self.lora = LoRAManager(
                self.model, self.config.lora_config, self.config.num_virtual_engines,
                self._max_forward_tokens(), self.dtype, self.device,
            )  # fmt: skip

    def _max_forward_tokens(self) -> int:
        """Tokens of the largest forward pass: the token budget, or a padded capture."""
        spec, sc = self.graph_spec, self.config.scheduler_config
        return max(sc.max_num_batched_tokens, sc.max_num_seqs, spec.sizes.max_batchsize_to_capture,
                   *spec.prefill_sizes, *spec.piecewise_sizes)  # fmt: skip

    @property
    def num_local_layers(self) -> int:
        return self.model.end_layer - self.model.start_layer

    def capture_graphs(
        self,
        kv_caches: list[list[torch.Tensor]],
        scratch_slots: list[int],
        capturer: GraphCapturer | None = None,
    ) -> None:
        """Capture the CUDA graphs of every virtual engine (see :mod:`vllm.cudagraph`).

        Args:
            kv_caches: kv_caches[ve][local_layer].
            scratch_slots: per VE, its scratch slot.
            capturer: graph factory; torch.cuda graphs when None (tests inject a fake).
        """
        self.graph_runner.capture(kv_caches, scratch_slots, capturer, self.pp_rank == 0)

    @torch.inference_mode()
    def estimate_graph_memory(
        self, num_virtual_engines: int, capturer: GraphCapturer | None = None
    ) -> int:
        """Bytes the CUDA graphs of every VE will take, measured before the KV cache is
        sized by a trial capture over a one-block cache
        (:func:`vllm.cudagraph.memory.estimate_graph_memory`). 0 when graphs are off.

        Args:
            num_virtual_engines: VEs the real capture will cover.
            capturer: graph factory of the trial (tests inject a fake).
        """
        from vllm.worker.cache_engine import CacheEngine

        if not self.use_cuda_graph:
            return 0
        cache = CacheEngine(
            self.model_config,
            self.attn_backend,
            1,
            self.block_size,
            self.num_local_layers,
            self.device,
            self.config.parallel_config.tensor_parallel_size,  # this rank's KV heads
        )
        estimate = estimate_graph_memory(
            self.graph_runner, cache.kv_caches, cache.scratch_slot, num_virtual_engines, capturer
        )
        del cache
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        return estimate

    # ------------------------------------------------------------------ inputs
    def prepare_model_input(
        self,
        seq_group_metadata_list: list[SequenceGroupMetadata],
        virtual_engine: int,
        scratch_slot: int,
        num_lookahead_slots: int = 0,
    ) -> ForwardBatch:
        """Flatten the scheduled groups into one :class:`ForwardBatch`, planned by the
        graph runner (see :func:`vllm.worker.model_input.prepare_model_input`)."""
        ctx = model_input.InputContext(
            block_size=self.block_size,
            device=self.device,
            attn_backend=self.attn_backend,
            graph_runner=self.graph_runner,
            vocab_size=self.model_config.vocab_size,
            samples=self.is_last_stage,
            generators=self.generators,
            pad_eager=self.pad_eager_batches,
            seed_stream=self.seed_stream,
            logprobs_mode=self.model_config.logprobs_mode,
        )
        batch = model_input.prepare_model_input(
            ctx, seq_group_metadata_list, virtual_engine, scratch_slot, num_lookahead_slots
        )
        if self.lora is not None:  # each token's adapter slot, in the VE's static buffer
            self.lora.stage(batch, seq_group_metadata_list)
        return batch

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
        hidden = self.forward_hidden(batch, kv_caches, intermediate_tensors)
        if not self.is_last_stage:
            return hidden
        sm = batch.sampling_metadata
        if sm.selected_token_indices.shape[0] == 0:  # only prefill chunks that sample nothing
            # (every TP rank sees the same metadata, so all of them skip the logit gather)
            if get_tensor_model_parallel_rank() != 0:
                return None
            return SamplerOutput([CompletionSequenceGroupOutput([]) for _ in sm.groups])
        logits = self.compute_logits(batch, hidden)
        if logits is None:  # a TP rank other than 0: the logits were gathered on rank 0
            return None
        return self.attach_pooled(self.sampler(logits, sm), hidden, batch)

    def attach_pooled(self, out: SamplerOutput, hidden: torch.Tensor, batch: ForwardBatch):
        """With ``--task embed``: each group's pooled vector (vllm/pooling/pooler.py) into
        its output's ``pooled``; ``out`` unchanged otherwise."""
        pooler = self.config.pooler_config
        if pooler is None or out is None:
            return out
        from vllm.pooling.pooler import pool

        for group_out, vec in zip(out.outputs, pool(pooler, hidden, batch)):
            group_out.pooled = vec
        return out

    def compute_logits(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [num_rows, vocab] of the rows ``batch.sampling_metadata`` selects
        from ``hidden`` [num_tokens, hidden] (last stage only; None on a TP rank other than
        0, whose logit shard was gathered on rank 0)."""
        sm = batch.sampling_metadata
        if batch.mode == ForwardMode.DECODE and sm.prompt_row_ids is None:
            # One row per sequence, in order. Padded lanes go through lm_head too (their
            # rows are dropped after): the matmul then has the batch's padded row count
            # whether a graph, a decode-loop graph or a padded eager step runs it, so the
            # three sample the same ids (a GEMM's kernel choice may depend on the row
            # count); the loop graph keeps the logits 16-bit for the greedy kernel, so its
            # logprobs agree to float32 rounding (vllm/cudagraph/decode_loop.py).
            logits = self.model.compute_logits(hidden)  # [batch_size, vocab] float32
            return None if logits is None else logits[: batch.num_real_rows]  # [num_rows, vocab]
        selected = hidden[sm.selected_token_indices]  # [num_rows, hidden]
        return self.model.compute_logits(selected)  # [num_rows, vocab] float32, or None

    def forward_hidden(
        self,
        batch: ForwardBatch,
        kv_caches: list[torch.Tensor],
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """The model forward of one step as the graph runner planned it (replay or eager,
        counted), without sampling: hidden states [num_tokens, hidden] on the last stage,
        else IntermediateTensors."""
        with set_forward_context(batch.virtual_engine):
            return self.graph_runner.run(batch, kv_caches, intermediate_tensors)

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
        md = self.attn_backend.build_metadata(step, 0)
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
            self.model.compute_logits(out[-num_seqs:])
