"""The periodic engine-statistics log line (``--disable-log-stats`` turns it off).

Every :data:`LOG_INTERVAL_S` seconds of activity the engine logs one INFO line with the
prompt and generation throughput over the interval (tokens / wall seconds), the running and
waiting requests, the KV-cache usage and the prefix-cache hit rate, under upstream vLLM's
wording. An idle engine does not repeat itself: once a line shows zero throughput and the
line before it did too, further all-zero lines go to DEBUG, until tokens flow again.

The server's :class:`~vllm.engine.metrics.EngineMetrics` and the offline
:class:`~vllm.engine.llm_engine.LLMEngine` (``LLM(disable_log_stats=False)``) each own one
and call :meth:`ThroughputLog.log` when :meth:`ThroughputLog.due`.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("vllm.engine.metrics")

LOG_INTERVAL_S = 10.0


class ThroughputLog:
    """Token counts since the last line, and the rule that decides when to write one.

    Args:
        interval_s: seconds between lines (at least; a line is written by the first
            :meth:`maybe_log` after the interval has passed).
    """

    def __init__(self, interval_s: float = LOG_INTERVAL_S):
        self.interval_s = interval_s
        self._last = time.monotonic()
        self._prompt = 0
        self._generation = 0
        self._last_was_zero = False

    def add(self, prompt_tokens: int, generation_tokens: int) -> None:
        """Count one step's prompt tokens (prefilled) and generated tokens."""
        self._prompt += prompt_tokens
        self._generation += generation_tokens

    def due(self) -> bool:
        """True when the interval since the last line has passed."""
        return time.monotonic() - self._last >= self.interval_s

    def log(self, running: int, waiting: int, cache_usage: float, prefix_hit_rate: float) -> None:
        """Write the line over the counts since the last one and start a new interval: at
        INFO, or at DEBUG when this line and the one before show an idle engine.

        Args:
            running / waiting: requests now, over all virtual engines.
            cache_usage / prefix_hit_rate: fractions in [0, 1], shown as percentages.
        """
        now = time.monotonic()
        elapsed = max(now - self._last, 1e-9)
        self._last = now
        prompt, generation = self._prompt / elapsed, self._generation / elapsed
        self._prompt = self._generation = 0
        zero = prompt == 0 and generation == 0 and running == 0 and waiting == 0
        level = logging.DEBUG if zero and self._last_was_zero else logging.INFO
        self._last_was_zero = zero
        logger.log(
            level,
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
            "Prefix cache hit rate: GPU: %.2f%%",
            prompt,
            generation,
            running,
            waiting,
            100.0 * cache_usage,
            100.0 * prefix_hit_rate,
        )
