"""Prometheus metrics of one serving engine, under upstream vLLM's metric names.

Every metric lives in a per-instance :class:`prometheus_client.CollectorRegistry`, so two
servers (or two tests) in one process never collide on the global registry.

Definitions (all times in seconds, from ``time.time()`` stamps of RequestMetrics):
- ``vllm:time_to_first_token_seconds``: first token time - arrival time, once per request.
- ``vllm:time_per_output_token_seconds``: the gap between consecutive tokens of a request,
  one observation per decode step it took part in.
- ``vllm:prompt_tokens_total``: prompt tokens prefilled (whole prompts and prefill chunks,
  once per request whatever its n, prefix-cached tokens included, as upstream counts them;
  a recomputed preempted request counts again, as upstream);
  ``vllm:generation_tokens_total``: sampled tokens; ``vllm:iteration_tokens_total``: a
  histogram of prompt + generation tokens per engine step (with chunked prefill a step
  holds both). The stats log line shows both rates over its interval.
- ``vllm:gpu_cache_usage_perc``: fraction (0..1) of KV blocks in use, mean over virtual
  engines (``BlockSpaceManager.usage()``).
- ``vllm:gpu_prefix_cache_queries_total`` / ``vllm:gpu_prefix_cache_hits_total``: prompt
  tokens looked up in the prefix cache / found there (prefills that may read it, recomputes
  included), summed over virtual engines; ``vllm:gpu_prefix_cache_hit_rate``: hits /
  queries since the start (0 before any query, and always 0 with caching off).
- ``vllm:spec_decode_*``: zero until speculative decoding reports (acceptance rate =
  accepted / proposed; efficiency = emitted / (steps x (k + 1))).
- ``vllm:decode_steps_total{mode,virtual_engine}``: the runner's replay/eager decode
  counters, as ``LLMEngine.decode_step_counters()`` returns them.
- ``vllm:request_success_total{finished_reason}``: finished sequences by finish reason,
  each of a request's ``n`` counted with its own reason (as upstream V0 counts finished
  sequences and V1 its ``n`` child requests); aborted requests count as "abort".
- ``vllm:num_preemptions_total``: requests preempted (by recompute), over virtual engines.
- Upstream V0's ``vllm:num_requests_swapped``, ``vllm:cpu_cache_usage_perc`` and
  ``vllm:cpu_prefix_cache_hit_rate``: always 0 (preemption recomputes; no CPU KV cache).
- Upstream's current (V1) names of the same series are exported beside the older ones:
  ``vllm:kv_cache_usage_perc`` (= gpu_cache_usage_perc), ``vllm:prefix_cache_queries_total``
  / ``vllm:prefix_cache_hits_total`` and ``vllm:inter_token_latency_seconds`` (the TPOT
  observations).
- Per-request histograms (queue, prefill, decode and inference time; prompt and generation
  tokens; the n and max_tokens parameters): vllm/engine/request_metrics.py, registered by
  :meth:`EngineMetrics.configure` once the engine's ``max_model_len`` is known, which also
  sets ``vllm:cache_config_info`` (1, the cache settings as labels).
- The registry also holds prometheus_client's ``process_*`` and ``python_*`` collectors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from vllm.engine.decode_step_metrics import DecodeStepsCollector
from vllm.engine.request_metrics import FinishedRequest, RequestHistograms
from vllm.engine.stats_log import ThroughputLog

_TTFT_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 10.0, 20.0]  # fmt: skip
_ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
_E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0]  # fmt: skip


@dataclass
class StepStats:
    """What one engine step adds to the metrics (built on the engine thread).

    Attributes:
        num_running / num_waiting: requests over all virtual engines after the step.
        cache_usage: KV-cache usage in [0, 1] (mean over virtual engines).
        prompt_tokens / generation_tokens: prompt tokens prefilled this step (once per
            request, prefix-cached ones included) / tokens sampled this step.
        ttft / tpot: seconds, one entry per observation (see the module docstring).
        finished: one :class:`FinishedRequest` per request that ended this step.
        preemptions: preemptions since the engine started (cumulative, all virtual engines).
        decode_steps: the engine's decode_step_counters() snapshot.
    """

    num_running: int = 0
    num_waiting: int = 0
    cache_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    decode_steps: dict | None = None
    spec_decode: dict | None = None  # LLMEngine.spec_decode_metrics(), cumulative
    # Prefix cache, cumulative over the engine's life: prompt tokens looked up / found.
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    # LoRA adapters (their names) of running / waiting requests; None without LoRA.
    lora_running: tuple[str, ...] | None = None
    lora_waiting: tuple[str, ...] | None = None


class EngineMetrics:
    """The Prometheus metrics of one engine, in their own registry.

    Args:
        model_name: the served model name, the ``model_name`` label of every metric.
        log_stats: write the periodic stats line (vllm/engine/stats_log.py); False for
            ``--disable-log-stats``. The metrics are kept either way.
    """

    def __init__(self, model_name: str, log_stats: bool = True):
        self.registry = CollectorRegistry(auto_describe=True)
        r, lbl, m = self.registry, ["model_name"], model_name
        self.num_running = Gauge(
            "vllm:num_requests_running", "Requests in a running batch.", lbl, registry=r
        ).labels(m)
        self.num_waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", lbl, registry=r
        ).labels(m)
        self.cache_usage = Gauge(
            "vllm:gpu_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", lbl, registry=r
        ).labels(m)
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", lbl, registry=r
        ).labels(m)
        # Upstream V0's swap space and CPU cache, absent here (preemption recomputes):
        # exported at 0 so scrapers and dashboards written for V0 find their series.
        for name, text in (
            ("num_requests_swapped", "Requests swapped to CPU (always 0: no swapping)."),
            ("cpu_cache_usage_perc", "CPU KV-cache usage (always 0: no CPU KV cache)."),
            ("cpu_prefix_cache_hit_rate", "CPU prefix-cache hit rate (always 0: none)."),
        ):
            Gauge(f"vllm:{name}", text, lbl, registry=r).labels(m).set(0)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Requests preempted (by recompute).", lbl, registry=r
        ).labels(m)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", lbl, registry=r
        ).labels(m)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", lbl, registry=r
        ).labels(m)
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Prompt plus generation tokens per engine step.",
            lbl,
            buckets=_ITERATION_BUCKETS,
            registry=r,
        ).labels(m)
        self._success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            [*lbl, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds.",
            lbl,
            buckets=_TTFT_BUCKETS,
            registry=r,
        ).labels(m)
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token in seconds.",
            lbl,
            buckets=_TPOT_BUCKETS,
            registry=r,
        ).labels(m)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between consecutive tokens of a request.",
            lbl,
            buckets=_TPOT_BUCKETS,
            registry=r,
        ).labels(m)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            lbl,
            buckets=_E2E_BUCKETS,
            registry=r,
        ).labels(m)
        self.spec_acceptance_rate = Gauge(
            "vllm:spec_decode_draft_acceptance_rate", "Accepted / proposed.", lbl, registry=r
        ).labels(m)
        self.spec_efficiency = Gauge(
            "vllm:spec_decode_efficiency", "Emitted / (steps x (k + 1)).", lbl, registry=r
        ).labels(m)
        self.spec_accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.", lbl, registry=r
        ).labels(m)
        self.spec_draft = Counter(
            "vllm:spec_decode_num_draft_tokens", "Proposed draft tokens.", lbl, registry=r
        ).labels(m)
        self.spec_emitted = Counter(
            "vllm:spec_decode_num_emitted_tokens", "Emitted tokens.", lbl, registry=r
        ).labels(m)
        self.prefix_hit_rate = Gauge(
            "vllm:gpu_prefix_cache_hit_rate",
            "Prefix-cache hit rate: cached prompt tokens / looked-up prompt tokens.",
            lbl,
            registry=r,
        ).labels(m)
        # The prefix-cache counters under upstream's V0 names (gpu_*) and current ones.
        queried, found = (
            "Prompt tokens looked up in the prefix cache.",
            "Prompt tokens found in the prefix cache.",
        )
        self.prefix_queries, self.prefix_queries_v1 = (
            Counter(f"vllm:{name}", queried, lbl, registry=r).labels(m)
            for name in ("gpu_prefix_cache_queries", "prefix_cache_queries")
        )
        self.prefix_hits, self.prefix_hits_v1 = (
            Counter(f"vllm:{name}", found, lbl, registry=r).labels(m)
            for name in ("gpu_prefix_cache_hits", "prefix_cache_hits")
        )
        self._preemptions_last = 0
        self.requests: RequestHistograms | None = None  # set by configure()
        self.lora_info: Gauge | None = None  # set by configure() with LoRA on
        self._loras_last: tuple[str, str] | None = None
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._prefix_last = (0, 0)
        self._hit_rate = 0.0
        # The periodic stats line (vllm/engine/stats_log.py); None: --disable-log-stats.
        self.stats_log = ThroughputLog() if log_stats else None
        self.decode_steps = DecodeStepsCollector()
        r.register(self.decode_steps)
        self._model_name = model_name

    def configure(
        self, max_model_len: int, cache_info: dict[str, object], max_loras: int | None = None
    ) -> None:
        """Register what needs the built engine (idempotent): the per-request histograms
        (token buckets up to ``max_model_len``), ``vllm:cache_config_info`` with
        ``cache_info`` as its labels (values shown with str()) and, with ``max_loras``
        (LoRA on), upstream's ``vllm:lora_requests_info``: one series whose labels name the
        running and waiting adapters (comma-separated) and ``max_lora``, valued at the time
        they last changed (seconds since the epoch)."""
        if self.requests is not None:
            return
        if max_loras is not None:
            self._max_loras = str(max_loras)
            self.lora_info = Gauge(
                "vllm:lora_requests_info", "Running and waiting LoRA adapters.",
                ["running_lora_adapters", "max_lora", "waiting_lora_adapters"],
                registry=self.registry,
            )  # fmt: skip
        self.requests = RequestHistograms(self.registry, self._model_name, max_model_len)
        labels = {k: str(v) for k, v in cache_info.items()}
        Gauge(
            "vllm:cache_config_info", "The KV-cache configuration (value 1, settings as labels).",
            list(labels), registry=self.registry,
        ).labels(**labels).set(1)  # fmt: skip

    def record(self, stats: StepStats) -> None:
        """Apply one step's :class:`StepStats` (thread-safe; prometheus_client locks)."""
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.cache_usage.set(stats.cache_usage)
        self.kv_cache_usage.set(stats.cache_usage)
        if stats.preemptions > self._preemptions_last:
            self.preemptions.inc(stats.preemptions - self._preemptions_last)
            self._preemptions_last = stats.preemptions
        if stats.prompt_tokens:
            self.prompt_tokens.inc(stats.prompt_tokens)
        if stats.generation_tokens:
            self.generation_tokens.inc(stats.generation_tokens)
        if stats.prompt_tokens or stats.generation_tokens:
            self.iteration_tokens.observe(stats.prompt_tokens + stats.generation_tokens)
        for t in stats.ttft:
            self.ttft.observe(t)
        for t in stats.tpot:
            self.tpot.observe(t)
            self.itl.observe(t)
        for req in stats.finished:
            for reason in req.reasons:
                self._success.labels(self._model_name, reason).inc()
            self.e2e.observe(req.e2e)
            if self.requests is not None:
                self.requests.observe(req)
        if stats.decode_steps is not None:
            self.decode_steps.set(stats.decode_steps)
        if stats.spec_decode is not None:
            self._record_spec(stats.spec_decode)
        self._record_prefix(stats)
        self._record_loras(stats)
        if self.stats_log is not None:
            self.stats_log.add(stats.prompt_tokens, stats.generation_tokens)
            if self.stats_log.due():
                self.stats_log.log(
                    stats.num_running, stats.num_waiting, stats.cache_usage, self._hit_rate
                )

    def _record_loras(self, stats: StepStats) -> None:
        """One ``vllm:lora_requests_info`` series for the adapters now (see configure)."""
        if self.lora_info is None or stats.lora_running is None:
            return
        key = (",".join(stats.lora_running), ",".join(stats.lora_waiting or ()))
        if key == self._loras_last:
            return
        self._loras_last = key
        self.lora_info.clear()
        self.lora_info.labels(key[0], self._max_loras, key[1]).set(time.time())

    def _record_prefix(self, stats: StepStats) -> None:
        """Advance the prefix-cache counters to the cumulative totals; set the rate."""
        queries, hits = self._prefix_last
        if stats.prefix_queries > queries:
            self.prefix_queries.inc(stats.prefix_queries - queries)
            self.prefix_queries_v1.inc(stats.prefix_queries - queries)
        if stats.prefix_hits > hits:
            self.prefix_hits.inc(stats.prefix_hits - hits)
            self.prefix_hits_v1.inc(stats.prefix_hits - hits)
        self._prefix_last = (
            max(queries, stats.prefix_queries), max(hits, stats.prefix_hits)
        )  # fmt: skip
        q, h = self._prefix_last
        self._hit_rate = h / q if q else 0.0
        self.prefix_hit_rate.set(self._hit_rate)

    def _record_spec(self, spec: dict) -> None:
        """Set the spec-decode gauges and advance the counters to the cumulative totals."""
        self.spec_acceptance_rate.set(spec["draft_acceptance_rate"])
        self.spec_efficiency.set(spec["system_efficiency"])
        last = getattr(self, "_spec_last", {})
        for counter, key in (
            (self.spec_accepted, "num_accepted_tokens"),
            (self.spec_draft, "num_draft_tokens"),
            (self.spec_emitted, "num_emitted_tokens"),
        ):
            delta = spec[key] - last.get(key, 0)
            if delta > 0:
                counter.inc(delta)
        self._spec_last = dict(spec)

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
