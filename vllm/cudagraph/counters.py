"""Counters of steps that replayed a CUDA graph and steps that ran eagerly (docs/design.md
guarantee 5: tests assert them, so a test cannot pass with graphs silently off).

Exposed to logs and to ``/metrics`` as ``vllm:decode_steps_total{mode,virtual_engine}``.
"""

from __future__ import annotations

import threading
from collections import Counter

# "mixed": a chunked-prefill step with prefill chunks and decode rows (never captured).
EAGER_REASONS = ("prefill", "enforce_eager", "too_big", "too_long", "mixed")


class DecodeStepCounters:
    """Thread-safe counts of replayed decode steps per (VE, captured size), eager steps per
    (VE, reason), reason in ``EAGER_REASONS``, replayed prefill graphs per (VE, captured
    token count) and prefill or mixed steps replayed from piecewise graphs per (VE, captured
    token count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.graph: Counter[tuple[int, int]] = Counter()
        self.eager: Counter[tuple[int, str]] = Counter()
        self.prefill_graph: Counter[tuple[int, int]] = Counter()
        self.piecewise_graph: Counter[tuple[int, int]] = Counter()

    def count_replay(self, virtual_engine: int, size: int) -> None:
        with self._lock:
            self.graph[(virtual_engine, size)] += 1

    def count_prefill_replay(self, virtual_engine: int, tokens: int) -> None:
        with self._lock:
            self.prefill_graph[(virtual_engine, tokens)] += 1

    def count_piecewise_replay(self, virtual_engine: int, tokens: int) -> None:
        with self._lock:
            self.piecewise_graph[(virtual_engine, tokens)] += 1

    def count_eager(self, virtual_engine: int, reason: str) -> None:
        if reason not in EAGER_REASONS:
            raise ValueError(f"unknown eager reason {reason!r}; expected one of {EAGER_REASONS}")
        with self._lock:
            self.eager[(virtual_engine, reason)] += 1

    def snapshot(self) -> dict[str, dict[int, dict[int | str, int]]]:
        """``{"graph": {ve: {size: n}}, "eager": {ve: {reason: n}}, "prefill_graph":
        {ve: {tokens: n}}, "piecewise_graph": {ve: {tokens: n}}}`` (plain dicts; a prefill
        replayed from a graph is in "prefill_graph", an eager one in "eager" under
        "prefill"; a prefill or mixed step replayed from piecewise graphs is in
        "piecewise_graph")."""
        tables = {
            "graph": self.graph,
            "eager": self.eager,
            "prefill_graph": self.prefill_graph,
            "piecewise_graph": self.piecewise_graph,
        }
        out: dict[str, dict[int, dict[int | str, int]]] = {name: {} for name in tables}
        with self._lock:
            for name, table in tables.items():
                for (ve, key), n in sorted(table.items()):
                    out[name].setdefault(ve, {})[key] = n
        return out
