"""Host-time accounting of one pipeline stage (read by the pipeline simulator).

A stage's step splits into: ``prepare`` (input preparation), ``forward`` (the model, replayed
or eager; on the simulator the stand-in's wait), ``transfer`` (receiving and sending
tensors between stages, waits included) and ``sample`` (logits and sampling, last stage).
The counters cost two ``perf_counter`` calls per phase.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

PHASES = ("prepare", "forward", "transfer", "sample")


class StageTimes:
    """Seconds spent per phase (:data:`PHASES`) and the number of steps, since the last reset.

    Attributes:
        seconds: phase -> accumulated seconds.
        steps: scheduler calls this stage ran (a multi-step call counts once).
        passes: forward passes this stage ran.
        calls_at_once: the most unfinished calls a stream held at once on this stage
            (vllm/worker/pp_stream.py; 0 without streams): above 1, calls of several
            virtual engines interleaved their passes.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self.passes = 0
        self.calls_at_once = 0

    @contextmanager
    def phase(self, name: str):
        """Add the time spent inside the ``with`` block to phase ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def snapshot(self) -> dict:
        """``{"steps", "passes", "calls_at_once", <phase>: seconds, ...}`` (a copy)."""
        counts = {"steps": self.steps, "passes": self.passes, "calls_at_once": self.calls_at_once}
        return {**counts, **self.seconds}
