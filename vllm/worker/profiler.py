"""The torch profiler of one worker, for ``LLM.start_profile`` / ``stop_profile`` and the
server's ``POST /start_profile`` / ``/stop_profile`` (upstream's names).

A trace is written only where ``VLLM_TORCH_PROFILER_DIR`` points: each rank writes its own
Chrome trace, ``<dir>/rank<R>.<pid>.<time>.pt.trace.json`` (torch's tensorboard trace
handler; open it in Perfetto or TensorBoard), covering CPU ops and, on CUDA, kernels, with
tensor shapes recorded.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class WorkerProfiler:
    """Start / stop a torch profiler (one at a time) for worker ``rank``.

    Args:
        rank: the worker's global rank (names its trace file).
        device_type: "cpu" or "cuda" (CUDA activity is recorded on CUDA only).
    """

    def __init__(self, rank: int, device_type: str):
        self.rank = rank
        self.device_type = device_type
        self._prof = None

    def start(self) -> None:
        """Start profiling.

        Raises:
            RuntimeError: VLLM_TORCH_PROFILER_DIR is not set, or a profile is running.
        """
        import torch

        from vllm import envs

        out_dir = envs.VLLM_TORCH_PROFILER_DIR
        if not out_dir:
            raise RuntimeError(
                "profiling needs VLLM_TORCH_PROFILER_DIR, the directory the traces go to; "
                "set it before the engine starts."
            )
        if self._prof is not None:
            raise RuntimeError("a profile is already running: stop it first.")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                out_dir, worker_name=f"rank{self.rank}"
            ),
        )
        self._prof.start()
        logger.info("Profiling rank %d into %s", self.rank, out_dir)

    def stop(self) -> None:
        """Stop profiling and write the trace.

        Raises:
            RuntimeError: no profile is running.
        """
        if self._prof is None:
            raise RuntimeError("no profile is running: start one first.")
        prof, self._prof = self._prof, None
        prof.stop()  # writes the trace (on_trace_ready)
