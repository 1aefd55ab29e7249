"""The pipeline simulator's stand-in model (``load_format="sim"``).

Each stage's forward queues a configured device time on the stage's simulated device
instead of computing, then returns tensors of the real shapes (zeros): ``IntermediateTensors``
of ``hidden_states`` and ``residual`` [num_tokens, hidden] on a non-last stage, hidden
states [num_tokens, hidden] on the last stage, and float32 logits [rows, vocab] (all
zeros, so greedy sampling picks token 0). Everything around it is the real engine:
scheduler, executors, stage workers, the transfers between stages and the sampler.
benchmarks/benchmark_pipeline_sim.py drives it; it is never a model for outputs.

The device time of one stage's forward, in seconds, is::

    (step_ms + per_row_us * rows / 1000 + per_token_us * tokens / 1000) / 1000 / pp_size

``step_ms`` (default 8.0) is the whole model's fixed time per step, split evenly over the
stages (the weight-bound regime of decode); ``rows`` are the batch's sequences (padded
lanes included) and ``tokens`` its new tokens. The values come from
``ModelConfig.model_loader_extra_config`` (keys ``step_ms``, ``per_row_us``,
``per_token_us``).

The simulated device is asynchronous, as a CUDA stream is (:class:`SimDevice`): a forward
is *launched* and returns at once; its work runs from ``max(now, device free, inputs
ready)`` for its device time, and the device is free again at the end. The host waits only
where it reads a result: ``compute_logits`` (the host reads what is sampled from the
logits) waits for the forward that produced its hidden states, as reading sampled ids does
on a GPU. Hidden
states sent to the next stage carry the time their forward finishes (a float64 stamp in
the first 8 bytes of ``hidden_states``, which are otherwise zeros), so the next stage's
forward starts no earlier than that, as an NCCL receive ordered on the receiver's stream
would. A stage's host is therefore free to prepare its next step while its device works,
exactly as on a GPU, and the same model applies at PP = 1. ``busy_s`` counts device
seconds (the sum of queued forward times); the simulator reports busy fraction = device
seconds / wall.

A multi-step call's passes before its last are sampled on the device and their ids fed to
the next pass without a host read (vllm/forward_context.py ``deferred_host_read``): there
``compute_logits`` does not wait. The ids of such a pass are ready when its forward is;
the last stage publishes that time per virtual engine in a small table shared by the
stages (:class:`ReadyTable`, a file of float64 times), and stage 0's next forward of
that virtual engine starts no earlier, as stage 0's device would wait for ids received
on its stream. Stage 0 reads the table only after its host received those ids, which
the last stage sends after publishing, so the time read is that pass's.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import tempfile
import time
from dataclasses import dataclass

import torch
from torch import nn

from vllm.distributed.utils import get_pp_indices
from vllm.forward_context import current_virtual_engine, host_read_deferred
from vllm.sequence import IntermediateTensors

SIM_KEYS = ("step_ms", "per_row_us", "per_token_us")


@dataclass(frozen=True)
class SimTiming:
    """The stand-in's device-time model (whole model, before the split over stages).

    Attributes:
        step_ms: fixed milliseconds per step.
        per_row_us: extra microseconds per batch row.
        per_token_us: extra microseconds per new token.
    """

    step_ms: float = 8.0
    per_row_us: float = 0.0
    per_token_us: float = 0.0

    @classmethod
    def from_extra_config(cls, extra: dict | None) -> SimTiming:
        """Read ``extra`` (``model_loader_extra_config``).

        Raises:
            ValueError: an unknown key (naming the known ones) or a negative value.
        """
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(SIM_KEYS))
        if unknown:
            raise ValueError(
                f"model_loader_extra_config keys {unknown} are not known to load_format='sim' "
                f"(known: {list(SIM_KEYS)})."
            )
        values = {k: float(v) for k, v in extra.items()}
        bad = {k: v for k, v in values.items() if v < 0}
        if bad:
            raise ValueError(f"simulated device times must be >= 0, got {bad}.")
        return cls(**values)

    def stage_seconds(self, rows: int, tokens: int, pp_size: int) -> float:
        """Device seconds of one stage's forward over ``rows`` rows and ``tokens`` tokens."""
        us = self.step_ms * 1000 + self.per_row_us * rows + self.per_token_us * tokens
        return us / 1e6 / pp_size


class SimDevice:
    """One stage's simulated device: an in-order queue of work on a clock.

    Times are ``time.monotonic()`` seconds, one clock for every process of the host, so a
    stamp made by one stage is meaningful to the next.

    Attributes:
        free_at: when the last queued work finishes.
        busy_s: device seconds queued since the last reset.
        wait_s: host seconds spent in :meth:`synchronize` since the last reset.
    """

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_s = 0.0
        self.wait_s = 0.0

    def launch(self, seconds: float, not_before: float = 0.0) -> float:
        """Queue ``seconds`` of work that may start at ``not_before`` at the earliest
        (its inputs' ready time); returns when it finishes. Does not wait."""
        start = max(time.monotonic(), self.free_at, not_before)
        self.free_at = start + seconds
        self.busy_s += seconds
        return self.free_at

    def synchronize(self, until: float | None = None) -> None:
        """Wait (sleep) until the work that finishes at ``until`` has finished (every
        queued work when None)."""
        end = self.free_at if until is None else min(until, self.free_at)
        t0 = time.monotonic()
        if end > t0:
            time.sleep(end - t0)
            self.wait_s += time.monotonic() - t0

    def reset(self) -> None:
        """Zero ``busy_s`` and ``wait_s`` (queued work and ``free_at`` are kept)."""
        self.busy_s = 0.0
        self.wait_s = 0.0


def write_ready_stamp(hidden: torch.Tensor, ready_at: float) -> None:
    """Store ``ready_at`` (float64) in the first 8 bytes of ``hidden`` (contiguous,
    at least 8 bytes)."""
    stamp = torch.tensor([ready_at], dtype=torch.float64).view(torch.uint8)  # [8]
    hidden.view(-1).view(torch.uint8)[:8].copy_(stamp)


def read_ready_stamp(hidden: torch.Tensor) -> float:
    """The stamp :func:`write_ready_stamp` stored in ``hidden``."""
    return float(hidden.reshape(-1).view(torch.uint8)[:8].view(torch.float64).item())


class ReadyTable:
    """When each virtual engine's last sampled ids are ready: float64 ``time.monotonic()``
    seconds, one per virtual engine, in a file every stage process of one host maps.

    The file is ``.sim_ids_ready`` in ``directory`` (the model directory) when that is
    writable, else a file in the temporary directory named by the directory's hash. Two
    simulations at once on one model directory would share it: give each its own (the
    benchmark writes one per run). Times left by an earlier run are in the past and never
    delay a forward.

    Raises:
        IndexError: a virtual engine outside [0, :attr:`SIZE`).
    """

    SIZE = 512  # virtual engines

    def __init__(self, directory: str):
        directory = os.path.abspath(directory)
        if os.path.isdir(directory) and os.access(directory, os.W_OK):
            path = os.path.join(directory, ".sim_ids_ready")
        else:
            digest = hashlib.sha1(directory.encode()).hexdigest()[:16]
            path = os.path.join(tempfile.gettempdir(), f"vllm-sim-ids-ready-{digest}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < 8 * self.SIZE:
                os.ftruncate(fd, 8 * self.SIZE)  # zeros: "ready long ago"
            self._map = mmap.mmap(fd, 8 * self.SIZE)
        finally:
            os.close(fd)
        # [SIZE] float64 over the shared pages
        self.times = torch.frombuffer(self._map, dtype=torch.float64, count=self.SIZE)

    def publish(self, virtual_engine: int, ready_at: float) -> None:
        """Record that ``virtual_engine``'s latest sampled ids are ready at ``ready_at``."""
        self.times[virtual_engine] = ready_at

    def ready_at(self, virtual_engine: int) -> float:
        """When ``virtual_engine``'s latest published ids are ready (0.0 if never)."""
        return float(self.times[virtual_engine])


class SimStageModel(nn.Module):
    """Stage ``pp_rank`` of ``pp_size`` of a model that only occupies its simulated device
    (see the module doc).

    Args:
        hf_config: the model's config (hidden_size, vocab_size, num_hidden_layers).
        pp_rank, pp_size: this stage and the number of stages.
        timing: the device-time model.
        dtype: dtype of the hidden states it returns.
        table_dir: where the stages share their :class:`ReadyTable` (the model directory).

    Attributes:
        device_clock: the stage's :class:`SimDevice`.
        num_forwards: forward passes so far.
    """

    def __init__(
        self, hf_config, pp_rank: int, pp_size: int, timing: SimTiming, dtype, table_dir: str
    ):
        super().__init__()
        self.hidden_size = hf_config.hidden_size
        self.vocab_size = hf_config.vocab_size
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.start_layer, self.end_layer = get_pp_indices(
            hf_config.num_hidden_layers, pp_rank, pp_size
        )
        self.timing = timing
        self.dtype = dtype
        self.device_clock = SimDevice()
        self.ids_ready = ReadyTable(table_dir)
        self.num_forwards = 0
        self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype), requires_grad=False)
        # Nothing here computes: one thread keeps the stage's host work (sampling, input
        # preparation) from spinning OpenMP workers against the other stages' processes.
        torch.set_num_threads(1)

    @property
    def busy_s(self) -> float:
        """Device seconds queued since the last reset."""
        return self.device_clock.busy_s

    def reset_counters(self) -> None:
        """Zero the device clock's counters and ``num_forwards`` (start of a timed run)."""
        self.device_clock.reset()
        self.num_forwards = 0

    def forward(self, input_ids, positions, kv_caches, attn_metadata, intermediate_tensors=None):
        """Queue this stage's device time (after its inputs are ready: the previous
        stage's hidden states, or on stage 0 the ids last sampled for this virtual engine);
        return zeros of the real shapes at once, the non-last stage's stamped with their
        ready time."""
        tokens = int(input_ids.shape[0])
        rows = int(getattr(attn_metadata, "num_rows", tokens) or tokens)
        ve = current_virtual_engine()
        if intermediate_tensors is not None:
            not_before = read_ready_stamp(intermediate_tensors["hidden_states"])
        else:
            not_before = self.ids_ready.ready_at(ve)
        seconds = self.timing.stage_seconds(rows, tokens, self.pp_size)
        ready_at = self.device_clock.launch(seconds, not_before)
        self.num_forwards += 1
        dev = self.anchor.device
        hidden = torch.zeros(tokens, self.hidden_size, dtype=self.dtype, device=dev)
        if self.pp_rank == self.pp_size - 1:
            hidden.sim_ready_at = ready_at  # read by compute_logits
            hidden.sim_virtual_engine = ve
            return hidden  # [num_tokens, hidden]
        write_ready_stamp(hidden, ready_at)
        residual = torch.zeros(tokens, self.hidden_size, dtype=self.dtype, device=dev)
        return IntermediateTensors({"hidden_states": hidden, "residual": residual})

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """Zero logits [rows, vocab] float32 for hidden [rows, hidden], once the device
        finished the forward that produced ``hidden`` (the host reads what is sampled from
        them: a synchronization), or at once for a pass whose ids the host reads later
        (``host_read_deferred``), publishing when they are ready. A forward launched after
        it need not have finished; for rows gathered out of the hidden states (a prefill's
        last tokens) the stand-in no longer knows their forward and waits for all queued
        work."""
        ready_at = getattr(hidden, "sim_ready_at", None)
        if ready_at is None or not host_read_deferred():
            self.device_clock.synchronize(ready_at)
        if ready_at is not None:
            self.ids_ready.publish(hidden.sim_virtual_engine, ready_at)
        return torch.zeros(hidden.shape[0], self.vocab_size, device=hidden.device)
