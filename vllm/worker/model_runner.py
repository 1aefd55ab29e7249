"""ModelRunner: input preparation and the forward pass of one pipeline stage.

Input preparation (``prepare_model_input``, in :mod:`vllm.worker.model_input`) is plain
host work over the scheduled groups; padding a decode batch or a one-sequence prefill to a
captured size is one step of it and works eagerly too (``pad_eager_batches``, a debug
switch). Execution replays a captured graph when the graph runner's gate says so (decided
during input preparation) and runs eagerly otherwise; capture and replay live in
:mod:`vllm.worker.graph_runner`. Every step is counted.
"""

from __future__ import annotations

import logging
import time

import torch

from vllm.attention.backends.abstract import AttentionSpec, ForwardMode, StepInputs
from vllm.attention.selector import get_attn_backend, which_attn_backend
from vllm.config import EngineConfig
from vllm.model_executor.layers.sampler import Sampler
from vllm.sequence import IntermediateTensors, SamplerOutput, SequenceGroupMetadata
from vllm.utils import pin_for, to_device
from vllm.worker import model_input
from vllm.worker.cuda_graph_sizes import (
    capture_sizes,
    prefill_capture_sizes,
    prefill_graph_max_tokens,
)
from vllm.worker.decode_loop import loop_sizes
from vllm.worker.forward_batch import ForwardBatch
from vllm.worker.step_counters import DecodeStepCounters

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
            device.type, self.dtype, self.model_config.head_size
        )
        cfg = self.model_config
        self.attn_spec = AttentionSpec(
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_size=cfg.head_size,
            block_size=self.block_size,
            dtype=self.dtype,
            device=device,
            max_seq_len_to_capture=config.compilation_config.max_seq_len_to_capture,
            small_decode_max_rows=config.compilation_config.small_decode_max_rows,
        )
        self.attn_backend = get_attn_backend(self.attn_backend_name)(self.attn_spec)
        self.sampler = Sampler()
        self.generators: dict[int, torch.Generator] = {}
        self.pad_eager_batches = False
        self.model = None
        cc = config.compilation_config
        spec = config.speculative_config
        k = getattr(spec, "num_speculative_tokens", 0) if spec is not None else 0
        # The rule's sizes (as if graphs were on): padding targets for graphs and for the
        # eager debug switch. Graphs themselves exist only once capture_graphs ran.
        self.capture_sizes = capture_sizes(
            config.scheduler_config.max_num_seqs,
            k,
            cc.max_cudagraph_capture_size,
            cc.cuda_graph_sizes,
        )
        self.prefill_sizes = self._prefill_sizes()
        self.use_cuda_graph = device.type == "cuda" and not cc.enforce_eager
        self.counters = DecodeStepCounters()
        self.graph_runner = None  # a GraphRunner after capture_graphs()

    def _prefill_sizes(self) -> tuple[int, ...]:
        """Token counts of the single-sequence prefill graphs (the rule in
        ``cuda_graph_sizes.prefill_capture_sizes``, up to min(VLLM_PREFILL_GRAPH_MAX_TOKENS,
        max_num_batched_tokens, max_model_len)); also the padding targets of the eager
        debug switch. None (``()``) at PP > 1 or on a backend without prefill graphs."""
        if self.pp_size > 1 or not self.attn_backend.supports_prefill_graphs:
            return ()
        cap = min(
            prefill_graph_max_tokens(),
            self.config.scheduler_config.max_num_batched_tokens,
            self.model_config.max_model_len,
        )
        return prefill_capture_sizes(cap)

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

    def capture_graphs(
        self, kv_caches: list[list[torch.Tensor]], scratch_slots: list[int], capturer=None
    ) -> None:
        """Capture decode graphs for every virtual engine (see vllm/worker/graph_runner.py).

        Args:
            kv_caches: kv_caches[ve][local_layer].
            scratch_slots: per VE, its scratch slot.
            capturer: graph factory; torch.cuda graphs when None (tests inject a fake).
        """
        from vllm.worker.graph_runner import GraphRunner

        steps = self.loop_steps()
        runner = GraphRunner(
            self,
            self.capture_sizes,
            len(kv_caches),
            self.config.compilation_config.max_seq_len_to_capture,
            capturer,
            loop_sizes=tuple(loop_sizes(self.capture_sizes.sizes, steps)),
            loop_steps=steps,
            prefill_sizes=self.prefill_sizes,
        )
        runner.capture_model(kv_caches, scratch_slots, show_progress=self.pp_rank == 0)
        self.graph_runner = runner

    def loop_steps(self) -> int:
        """Steps a decode-loop graph's ring holds: num_scheduler_steps on a single-stage
        runner (multi-step decoding is PP = 1 only), else 0 (no loop graphs)."""
        if self.pp_size > 1:
            return 0
        return self.config.scheduler_config.num_scheduler_steps

    @torch.inference_mode()
    def estimate_graph_memory(self, num_virtual_engines: int) -> int:
        """Bytes the CUDA graphs of every VE will take, measured before the KV cache is
        sized: a trial capture of the two largest decode sizes (and the largest prefill)
        into a throwaway pool over a one-block cache, extrapolated
        (graph_runner.extrapolate_graph_memory). 0 when graphs are off.

        The two largest, not the largest and the smallest: the second graph's increment is
        what each further graph costs, and the smallest size may take a path that
        allocates nothing per size (FLASHINFER's one-row small-decode kernel) where the
        others each build a wrapper with its own 8 MiB int workspace (measured on an H200:
        0.079 GiB estimated against 0.363 GiB captured for SmolLM2's 46 graphs with the
        largest / smallest probe). Sizes on such a cheaper path are over-counted by that
        difference, which errs on the safe side."""
        from vllm.worker.cache_engine import CacheEngine
        from vllm.worker.cuda_graph_sizes import CaptureSizes
        from vllm.worker.graph_runner import GraphRunner, extrapolate_graph_memory

        sizes = self.capture_sizes.sizes
        if not self.use_cuda_graph or not sizes:
            return 0
        probe = tuple(sorted(sizes)[-2:])
        cache = CacheEngine(
            self.model_config,
            self.attn_backend,
            1,
            self.block_size,
            self.num_local_layers,
            self.device,
        )
        trial = GraphRunner(
            self,
            CaptureSizes(probe, probe[-1], probe[-1]),
            1,
            self.config.compilation_config.max_seq_len_to_capture,
            prefill_sizes=self.prefill_sizes[-1:],  # the largest prefill's activations
        )
        trial.capture_model([cache.kv_caches], [cache.scratch_slot], show_progress=False)
        trace = trial.memory_trace
        del trial, cache
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        loops = len(loop_sizes(sizes, self.loop_steps()))
        # every other prefill graph keeps its output, [tokens, hidden] (the trial captured
        # the largest of one VE)
        hidden = self.model_config.hf_config.hidden_size
        row = hidden * torch.empty((), dtype=self.dtype).element_size()
        tokens = sum(self.prefill_sizes) * num_virtual_engines - sum(self.prefill_sizes[-1:])
        outputs = tokens * row
        graphs = len(sizes) + loops
        return extrapolate_graph_memory(trace, graphs, num_virtual_engines) + outputs

    # ------------------------------------------------------------------ inputs
    def prepare_model_input(
        self,
        seq_group_metadata_list: list[SequenceGroupMetadata],
        virtual_engine: int,
        scratch_slot: int,
        num_lookahead_slots: int = 0,
    ) -> ForwardBatch:
        """Flatten the scheduled groups into one :class:`ForwardBatch` (see
        :func:`vllm.worker.model_input.prepare_model_input`)."""
        return model_input.prepare_model_input(
            self, seq_group_metadata_list, virtual_engine, scratch_slot, num_lookahead_slots
        )

    def place_input(self, values: list[int], graph_size: int | None) -> torch.Tensor:
        """An int64 model input (token ids or positions) where the step reads it: on the
        device for an eager step, in pinned host memory for a replay (which uploads it
        straight into the graph's static input buffer)."""
        host = torch.tensor(values, dtype=torch.long)
        if graph_size is None:
            return to_device(host, self.device)
        return pin_for(host, self.device)

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
        return self.sampler(self.compute_logits(batch, hidden), batch.sampling_metadata)

    def compute_logits(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [num_rows, vocab] of the rows ``batch.sampling_metadata`` selects
        from ``hidden`` [num_tokens, hidden] (last stage only)."""
        sm = batch.sampling_metadata
        if batch.mode == ForwardMode.DECODE and sm.prompt_row_ids is None:
            # One row per sequence, in order. Padded lanes go through lm_head too (their
            # rows are dropped after): the matmul then has the batch's padded row count
            # whether a graph, a decode-loop graph or a padded eager step runs it, so the
            # three agree exactly (a GEMM's kernel choice may depend on the row count).
            logits = self.model.compute_logits(hidden).float()  # [batch_size, vocab]
            return logits[: batch.num_real_rows]  # [num_rows, vocab]
        selected = hidden[sm.selected_token_indices]  # [num_rows, hidden]
        return self.model.compute_logits(selected).float()  # [num_rows, vocab]

    def forward_hidden(
        self,
        batch: ForwardBatch,
        kv_caches: list[torch.Tensor],
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """The model forward of one step (graph replay or eager, counted), without sampling:
        hidden states [num_tokens, hidden] on the last stage, else IntermediateTensors."""
        ve = batch.virtual_engine
        if batch.graph_size is not None:
            hidden = self.graph_runner.replay(
                ve,
                batch.graph_size,
                batch.input_ids,
                batch.positions,
                batch.step,
                intermediate_tensors,
            )
            if batch.mode == ForwardMode.PREFILL:
                self.counters.count_prefill_replay(ve, batch.graph_size)
            else:
                self.counters.count_replay(ve, batch.graph_size)
        else:
            self.counters.count_eager(ve, batch.eager_reason)
            hidden = self.model(
                batch.input_ids,
                batch.positions,
                kv_caches,
                batch.attn_metadata,
                intermediate_tensors,
            )
        return hidden

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
            self.model.compute_logits(out[-num_seqs:]).float()
