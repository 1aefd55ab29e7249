"""``vllm:decode_steps_total{mode,virtual_engine}``: the model runner's graph-replay / eager
decode counters (``LLMEngine.decode_step_counters()``) as a Prometheus collector, so that
/metrics proves which steps replayed CUDA graphs."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily


def flatten_decode_counters(counters: dict) -> dict[tuple[str, str], float]:
    """``LLMEngine.decode_step_counters()`` as {(mode, virtual_engine): decode steps}.

    Input: the runner's snapshot ``{"graph": {ve: {size: n}}, "eager": {ve: {reason: n}},
    "piecewise_graph": {ve: {tokens: n}}}`` (sizes and reasons are summed; eager "prefill"
    steps are not decode steps and are left out; "piecewise_graph" counts prefill and mixed
    steps replayed from piecewise graphs), or under pipeline parallelism one such snapshot
    per stage rank, ``{rank: snapshot}``.
    Every stage runs every step, so the first stage's snapshot is the engine's count (a sum
    over stages would count each step once per stage, and reading the rank as the virtual
    engine would mislabel it).
    """
    counters = counters or {}
    if counters and all(isinstance(k, int) for k in counters):
        counters = counters[min(counters)] or {}  # per-stage form: {rank: snapshot}
    flat: dict[tuple[str, str], float] = {}
    for mode in ("graph", "eager", "piecewise_graph"):
        for ve, per_key in (counters.get(mode) or {}).items():
            n = sum(v for k, v in per_key.items() if not (mode == "eager" and k == "prefill"))
            if n:
                flat[(mode, str(ve))] = flat.get((mode, str(ve)), 0.0) + float(n)
    return flat


class DecodeStepsCollector:
    """Exposes the latest decode-step snapshot as ``vllm:decode_steps_total``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str], float] = {}

    def set(self, counters: dict) -> None:
        values = flatten_decode_counters(counters)
        with self._lock:
            self._values = values

    def collect(self) -> Iterable[CounterMetricFamily]:
        fam = CounterMetricFamily(
            "vllm:decode_steps",
            "Decode steps by mode (graph replay / eager) and virtual engine.",
            labels=["mode", "virtual_engine"],
        )
        with self._lock:
            for (mode, ve), n in sorted(self._values.items()):
                fam.add_metric([mode, ve], n)
        yield fam
