"""Worker: one device (one rank: a TP shard of a pipeline stage) — device setup, model,
KV caches, steps.

The KV cache is a list indexed by virtual engine: ``cache_engines[ve].kv_caches[layer]``.
"""

from __future__ import annotations

import logging
import os

import torch

from vllm.config import EngineConfig
from vllm.cudagraph import GraphCapturer
from vllm.sequence import ExecuteModelRequest, SamplerOutput
from vllm.worker.cache_engine import CacheEngine, cache_block_bytes
from vllm.worker.gpu_memory import kv_budget_bytes, kv_room_bytes, non_torch_bytes
from vllm.worker.model_runner import ModelRunner
from vllm.worker.stage_timing import StageTimes

logger = logging.getLogger(__name__)


def cpu_threads(world_size: int, chosen: int | None = None) -> int:
    """Intra-op threads of one CPU worker.

    Returns:
        ``chosen`` (:attr:`ParallelConfig.cpu_threads`, from ``OMP_NUM_THREADS`` where the
        engine started) when given, else this host's cores divided by ``world_size``, at
        least 1.
    """
    if chosen is not None:
        return chosen
    return max(1, (os.cpu_count() or 1) // world_size)


class Worker:
    """Runs one rank of the model (one TP shard of one pipeline stage) on one device.

    Args:
        config: the engine config.
        rank: global rank ``pp_rank * tp + tp_rank`` (0 for a single device).
        local_rank: device index on this host (CUDA).
        seed_stream: the random stream of its runner's seeded generators (0; a draft
            model's worker another, see ``sampling_metadata.stream_seed``).
    """

    def __init__(
        self, config: EngineConfig, rank: int = 0, local_rank: int = 0, seed_stream: int = 0
    ):
        self.config = config
        self.seed_stream = seed_stream
        self.rank = rank
        self.local_rank = local_rank
        self.pp_size = config.parallel_config.pipeline_parallel_size
        self.tp_size = config.parallel_config.tensor_parallel_size
        self.pp_rank, self.tp_rank = divmod(rank, self.tp_size)
        self.num_virtual_engines = config.num_virtual_engines
        dev = config.device_config.device
        self.device = torch.device(f"cuda:{local_rank}" if dev == "cuda" else "cpu")
        self.model_runner: ModelRunner | None = None
        self.cache_engines: list[CacheEngine] = []
        self.times = StageTimes()
        self._stage = None  # the PipelineStage, built at the first step under PP
        # Bytes outside torch on the device when init_device took it (CUDA; gpu_memory.py)
        self.non_torch_at_start: int | None = None

    def init_device(self) -> None:
        """Select the device and seed torch's generators with the engine seed."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)  # creates the context
            reserved = torch.cuda.memory_reserved(self.device)
            self.non_torch_at_start = non_torch_bytes(free, total, reserved)
        else:
            parallel = self.config.parallel_config
            torch.set_num_threads(cpu_threads(parallel.world_size, parallel.cpu_threads))
        torch.manual_seed(self.config.model_config.seed)
        self.model_runner = ModelRunner(self.config, self.device, self.pp_rank, self.pp_size)
        self.model_runner.seed_stream = self.seed_stream

    def load_model(self) -> None:
        self.model_runner.load_model()

    def get_cache_block_size_bytes(self) -> int:
        """Bytes of one KV block over this stage's layers (upstream V0's worker method name)."""
        return cache_block_bytes(
            self.config.model_config,
            self.config.cache_config.block_size,
            self.model_runner.num_local_layers,
            self.tp_size,
            self.model_runner.attn_spec.cache_dtype,
        )

    @torch.inference_mode()
    def determine_num_available_blocks(self) -> int:
        """Blocks per virtual engine this stage can hold (before the scratch block).

        CPU: VLLM_CPU_KVCACHE_SPACE bytes / bytes per block. CUDA: total memory x
        gpu_memory_utilization minus the peak of a profiling forward of
        max_num_batched_tokens tokens. ``kv_cache_memory_bytes``, when set, is the bytes
        on either (on CUDA after the same profiling, checked against the room left). The
        stage's count is split evenly across virtual engines, one block each kept back as
        scratch (the padding lanes' slot). ``num_gpu_blocks_override`` (blocks per stage,
        as upstream) wins and is the usable count: the scratch blocks come on top. The
        result may be below 1 (nothing fits): the executor refuses it with the other
        capacity checks (``check_kv_capacity``).

        Raises:
            ValueError: ``kv_cache_memory_bytes`` is more than the device has room for
                (CUDA), naming both.
        """
        cc = self.config.cache_config
        block_bytes = self.get_cache_block_size_bytes()
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override // self.num_virtual_engines
        if self.device.type == "cpu":
            kv_bytes = cc.kv_cache_memory_bytes or cc.cpu_kvcache_space_bytes
            total = kv_bytes // block_bytes
        else:
            total = self._profile_cuda_blocks(block_bytes)
        per_ve = total // self.num_virtual_engines - 1
        if per_ve < 1:
            logger.warning(
                "No KV-cache blocks fit: %d blocks of %d bytes for %d virtual engines.",
                total,
                block_bytes,
                self.num_virtual_engines,
            )
        return max(per_ve, 0)

    def _profile_cuda_blocks(self, block_bytes: int) -> int:
        """KV blocks that fit in total x gpu_memory_utilization - peak - graph memory
        (vllm/worker/gpu_memory.py: this engine's share; other processes' memory is not
        charged to it, and what is free bounds it).

        The peak comes from one profiling forward of max_num_batched_tokens tokens (weights
        included, as torch allocated them); memory this process allocated outside torch
        since :meth:`init_device` counts against the budget; graph memory is measured by a
        trial capture (ModelRunner.estimate_graph_memory) because the real capture needs the
        KV cache.
        """
        sc = self.config.scheduler_config
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        num_seqs = min(sc.max_num_seqs, sc.max_num_batched_tokens)
        self.model_runner.profile_run(sc.max_num_batched_tokens, num_seqs)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        graphs = self.model_runner.estimate_graph_memory(self.num_virtual_engines)
        util = self.config.cache_config.gpu_memory_utilization
        budget, outside = kv_budget_bytes(
            total, free, reserved, util, peak, graphs, self.non_torch_at_start
        )
        wanted = self.config.cache_config.kv_cache_memory_bytes
        if wanted is not None:
            room = kv_room_bytes(free, reserved, peak, graphs)
            if wanted > room:
                raise ValueError(
                    f"kv_cache_memory_bytes={wanted} ({wanted / 2**30:.2f} GiB) does not fit "
                    f"on {self.device}: {max(room, 0)} bytes ({max(room, 0) / 2**30:.2f} GiB) "
                    "are left after the weights, a forward's activations and the CUDA "
                    "graphs. Lower it, or leave it unset to size the cache by "
                    "gpu_memory_utilization."
                )
            budget = wanted
        logger.info(
            "Memory profile: total %.2f GiB, free %.2f GiB, peak %.2f GiB, outside torch "
            "(this process) %.2f GiB, graphs (estimated) %.3f GiB, KV budget %.2f GiB",
            total / 2**30,
            free / 2**30,
            peak / 2**30,
            outside / 2**30,
            graphs / 2**30,
            budget / 2**30,
        )
        self.estimated_graph_bytes = graphs
        return budget // block_bytes

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate one KV cache per virtual engine, each of ``num_blocks`` (+1 scratch)."""
        self.cache_engines = [
            CacheEngine(
                self.config.model_config,
                self.model_runner.attn_backend,
                num_blocks,
                self.config.cache_config.block_size,
                self.model_runner.num_local_layers,
                self.device,
                self.tp_size,
            )
            for _ in range(self.num_virtual_engines)
        ]
        n_kv = num_blocks * self.config.cache_config.block_size
        logger.info(
            "KV cache: %d blocks (%d tokens) per virtual engine x %d virtual engines, %.2f GiB",
            num_blocks,
            n_kv,
            self.num_virtual_engines,
            self.num_virtual_engines * (num_blocks + 1) * self.get_cache_block_size_bytes() / 2**30,
        )

    def capture_graphs(self, capturer: GraphCapturer | None = None) -> None:
        """Capture decode CUDA graphs for every virtual engine after the KV caches exist
        (graphs bake in the cache addresses). No-op on CPU or with enforce_eager unless a
        test injects ``capturer`` (a fake graph factory)."""
        if capturer is None and not self.model_runner.use_cuda_graph:
            return
        slots = [ce.scratch_slot for ce in self.cache_engines]
        self.model_runner.capture_graphs(self.kv_caches, slots, capturer)

    def lora_call(self, method: str, arg) -> None:
        """``LoRAManager.<method>(arg)`` on this rank (``add``, ``remove`` or ``pin``; see
        vllm/lora/manager.py); the engine checks first that LoRA is on."""
        getattr(self.model_runner.lora, method)(arg)

    def start_profile(self) -> None:
        """Start this rank's torch profiler (vllm/worker/profiler.py)."""
        self._profiler().start()

    def stop_profile(self) -> None:
        """Stop this rank's torch profiler and write its trace."""
        self._profiler().stop()

    def _profiler(self):
        from vllm.worker.profiler import WorkerProfiler

        if getattr(self, "profiler", None) is None:
            self.profiler = WorkerProfiler(self.rank, self.device.type)
        return self.profiler

    def startup_summary(self) -> dict:
        """What this stage chose (device, dtype, backend, KV bytes, graphs): see
        :func:`vllm.worker.startup_summary.stage_summary`."""
        from vllm.worker.startup_summary import stage_summary

        return stage_summary(self)

    @property
    def kv_caches(self) -> list[list[torch.Tensor]]:
        """kv_caches[virtual_engine][local_layer]."""
        return [ce.kv_caches for ce in self.cache_engines]

    @torch.inference_mode()
    def execute_model(
        self, request: ExecuteModelRequest | list[ExecuteModelRequest]
    ) -> SamplerOutput | list[SamplerOutput] | None:
        """Run one step of ``request.virtual_engine``; None for an empty request.

        With ``num_scheduler_steps`` > 1 a decode request runs up to that many decode
        passes (vllm/worker/multi_step.py at PP = 1; ``request.num_steps`` passes under PP),
        except when a sequence has a structured-output bitmask: its next mask needs the
        engine's grammar matcher, so such a step runs one pass. Under PP (without TP) a list
        of requests is a round (vllm/worker/pp_stage.py): the last stage returns their
        SamplerOutputs in order, the other stages None.
        """
        if isinstance(request, list):
            return self.execute_round(request)
        if not request.seq_group_metadata_list:
            return None
        if self.pp_size > 1 and self.tp_size == 1:
            out = self.execute_round([request])
            return out[0] if out is not None else None
        ve = request.virtual_engine
        ce = self.cache_engines[ve]
        steps = self.config.scheduler_config.num_scheduler_steps
        self.times.steps += 1
        mds = request.seq_group_metadata_list
        guided = any(md.guided_bitmasks for md in mds)
        if steps > 1 and not mds[0].is_prompt and not guided:
            from vllm.worker.multi_step import execute_multi_step

            with self.times.phase("forward"):
                return execute_multi_step(
                    self.model_runner,
                    request.seq_group_metadata_list,
                    ve,
                    ce.scratch_slot,
                    ce.kv_caches,
                    steps,
                    request.async_callback,
                    self.assert_plan_agreement if self.tp_size > 1 else None,
                )
        runner = self.model_runner
        with self.times.phase("prepare"):
            batch = runner.prepare_model_input(
                request.seq_group_metadata_list, ve, ce.scratch_slot, request.num_lookahead_slots
            )
        if self.tp_size > 1:  # the TP path: ranks of a stage agree, logits gathered on rank 0
            self.assert_plan_agreement(batch)
            if self.pp_size > 1:
                return self._execute_pipeline_stage(batch, ce.kv_caches)
            with self.times.phase("forward"):
                return runner.execute_model(batch, ce.kv_caches)
        with self.times.phase("forward"):
            hidden = runner.forward_hidden(batch, ce.kv_caches)
        self.times.passes += 1
        with self.times.phase("sample"):
            logits = runner.compute_logits(batch, hidden)
            out = runner.sampler(logits, batch.sampling_metadata, request.async_callback)
            return runner.attach_pooled(out, hidden, batch)

    def _execute_pipeline_stage(self, batch, kv_caches) -> SamplerOutput | None:
        """One step of a stage of a pipeline with tensor parallelism (``tp_size > 1``;
        without TP every PP step runs through vllm/worker/pp_stage.py).

        A non-first stage receives ``IntermediateTensors`` [num_tokens, hidden] from the
        previous stage's rank of the same TP index; a non-last stage sends its output on
        and returns None. Only the sampling rank returns the SamplerOutput.
        """
        from vllm.distributed.communication import (
            recv_intermediate_tensors,
            send_intermediate_tensors,
        )

        group = self._pp_group()
        inter = None
        if not group.is_first_rank:
            inter = recv_intermediate_tensors(
                batch.input_ids.shape[0],
                self.config.model_config.hf_config.hidden_size,
                self.config.model_config.torch_dtype,
                self.device,
                group.prev_rank,
            )
        out = self.model_runner.execute_model(batch, kv_caches, inter)
        if group.is_last_rank:
            return out
        send_intermediate_tensors(out, group.next_rank)
        return None

    def execute_round(self, requests: list[ExecuteModelRequest]) -> list[SamplerOutput] | None:
        """Run a round of requests on this pipeline stage (vllm/worker/pp_stage.py).

        Raises:
            RuntimeError: no pipeline group in this process, or a stage disagrees with
                stage 0 on a step's plan.
        """
        requests = [r for r in requests if r.seq_group_metadata_list]
        if not requests:
            return None if self.pp_rank < self.pp_size - 1 else []
        if self._stage is None:
            from vllm.worker.pp_stage import PipelineStage

            self._stage = PipelineStage(self, self._pp_group())
        return self._stage.run(requests)

    @torch.inference_mode()
    def stream_calls(self, tag, request: ExecuteModelRequest, source) -> None:
        """Serve ``request`` and the calls that follow it as a stream on this pipeline
        stage (vllm/worker/pp_stream.py; the mp executor's workers at TP = 1): outputs go
        to ``source.reply`` as each call finishes.

        Raises:
            RuntimeError: as :meth:`execute_round`.
        """
        if self._stage is None:
            from vllm.worker.pp_stream import StreamingStage

            self._stage = StreamingStage(self, self._pp_group())
        self._stage.stream(tag, request, source)

    def _pp_group(self):
        from vllm.distributed.parallel_state import get_pp_group

        group = get_pp_group()
        if group is None:
            raise RuntimeError(
                f"pipeline_parallel_size={self.pp_size} but this process has no pipeline "
                "group (workers of a pipeline run under the mp or Ray executor)."
            )
        return group

    def stage_times(self) -> dict:
        """This stage's host-time split and step counts since the last reset
        (vllm/worker/stage_timing.py), with ``device_busy_s``: the simulator's device
        seconds when the model is its stand-in (load_format "sim"), else the forward time,
        and ``device_wait_s``: the stand-in's host waits for its device (0 otherwise); and
        the stand-in's own count of forward passes as ``passes``."""
        snap = self.times.snapshot()
        model = self.model_runner.model
        clock = getattr(model, "device_clock", None)
        snap["device_busy_s"] = snap["forward"] if clock is None else clock.busy_s
        snap["device_wait_s"] = 0.0 if clock is None else clock.wait_s
        snap["passes"] = getattr(model, "num_forwards", snap["passes"])
        return snap

    def reset_stage_times(self) -> None:
        """Zero the counters of :meth:`stage_times` (and the stand-in's)."""
        self.times.reset()
        reset = getattr(self.model_runner.model, "reset_counters", None)
        if reset is not None:
            reset()

    def assert_plan_agreement(self, batch) -> None:
        """The TP ranks of this stage must run the same plan (graph replay of one size, or
        eager) for every step, or their all-reduces deadlock: exchange it and raise on a
        difference (:func:`vllm.distributed.tp_ops.assert_tp_plan_agreement`)."""
        from vllm.attention.backends.abstract import ForwardMode
        from vllm.distributed.tp_ops import assert_tp_plan_agreement

        graph = -1 if batch.graph_size is None else batch.graph_size
        mode = 1 if batch.mode == ForwardMode.DECODE else 0
        # num_tokens: padded; piecewise: a piecewise replay and a prefill graph of one size
        plan = (batch.virtual_engine, mode, graph, batch.num_tokens, int(batch.piecewise))
        assert_tp_plan_agreement(plan)

    def free_sequences(self, seq_ids: list[int]) -> None:
        """Forget per-sequence state of finished sequences."""
        self.model_runner.free_finished(seq_ids)
