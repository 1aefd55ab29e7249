"""Upstream vLLM flags for features this engine does not have, accepted at the values that
ask for nothing it lacks.

A launch command or ``--config`` file written for upstream often repeats upstream's
defaults (``--data-parallel-size 1``, ``--no-async-scheduling``, ``--worker-cls auto``) or
names a feature this engine does not implement (``--enable-sleep-mode``,
``--kv-transfer-config``). Each flag of :data:`ENGINE_FLAGS` (EngineArgs fields, so
``LLM(data_parallel_size=1)`` works as well) and of :data:`SERVER_FLAGS` (``vllm serve``'s
own) is accepted at the values listed in its ``supported`` text, which change nothing
here, and any other value is refused with one ValueError naming the flag, the value and
what is supported, when the arguments are validated (``EngineArgs.create_engine_config``,
``validate_server_args``), before any weight is read.

Flags accepted at every value are not listed: ``--disable-cascade-attn`` (there is no
cascade attention), and the ones of vllm/engine/compat_args.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamFlag:
    """One upstream flag: ``name`` (its EngineArgs field or argparse dest), ``accepts``
    (whether a value asks for nothing missing here), ``supported`` (those values, in words)
    and ``why`` (what this engine lacks, and what to do instead)."""

    name: str
    accepts: Callable[[Any], bool]
    supported: str
    why: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def refusal(self, value: Any) -> str:
        """The one-line error for ``value``: the keyword form, the flag as typed, why, and
        the supported values."""
        if value is True:
            typed = self.flag
        elif value is False:
            typed = "--no-" + self.flag[2:]
        elif isinstance(value, dict):
            typed = f"{self.flag} '{json.dumps(value)}'"
        else:
            typed = f"{self.flag} {value}"
        return (
            f"{self.name}={value!r} ({typed}) is not supported: {self.why}; "
            f"supported: {self.supported}."
        )


def _one_of(*values: Any) -> Callable[[Any], bool]:
    """Accept exactly ``values`` (``True`` is not ``1`` here: a switch is not a count)."""
    return lambda v: any(v is w or (type(v) is type(w) and v == w) for w in values)


def _no_media(value: Any) -> bool:
    """``limit_mm_per_prompt`` that allows no multimodal item: None, or a JSON object (or
    its text) whose every entry is 0 or ``{"count": 0, ...}``."""
    if value is None:
        return True
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return False
    if not isinstance(value, dict):
        return False
    counts = [v.get("count") if isinstance(v, dict) else v for v in value.values()]
    return all(isinstance(c, int) and not isinstance(c, bool) and c == 0 for c in counts)


_NO_DP = "data parallelism is not implemented (one engine per server: run a server per replica"
_NO_DP += " behind a load balancer)"

ENGINE_FLAGS = (
    UpstreamFlag("data_parallel_size", _one_of(1), "1", _NO_DP),
    UpstreamFlag("data_parallel_size_local", _one_of(None, 1), "1 (or unset)", _NO_DP),
    UpstreamFlag("data_parallel_rank", _one_of(None, 0), "0 (or unset)", _NO_DP),
    UpstreamFlag("data_parallel_start_rank", _one_of(None, 0), "0 (or unset)", _NO_DP),
    UpstreamFlag("data_parallel_address", _one_of(None), "unset", _NO_DP),
    UpstreamFlag("data_parallel_rpc_port", _one_of(None), "unset", _NO_DP),
    UpstreamFlag("data_parallel_backend", _one_of("mp"), "'mp' (the default)", _NO_DP),
    UpstreamFlag("data_parallel_hybrid_lb", _one_of(False), "off", _NO_DP),
    UpstreamFlag("data_parallel_external_lb", _one_of(False), "off", _NO_DP),
    UpstreamFlag(
        "enable_expert_parallel",
        _one_of(False),
        "off",
        "expert parallelism is not implemented; under --tensor-parallel-size every rank "
        "holds its slice of every expert",
    ),  # fmt: skip
    UpstreamFlag(
        "enable_eplb",
        _one_of(False),
        "off",
        "expert-parallel load balancing is not implemented (nor expert parallelism)",
    ),  # fmt: skip
    UpstreamFlag(
        "async_scheduling",
        _one_of(None, False),
        "off (--no-async-scheduling, or unset)",
        "each step is scheduled after the previous step's tokens are applied (async output "
        "processing, on by default on one CUDA device, overlaps only the output processing)",
    ),  # fmt: skip
    UpstreamFlag(
        "enable_sleep_mode",
        _one_of(False),
        "off",
        "sleep mode (LLM.sleep / wake_up, freeing the weights and KV cache) is not implemented",
    ),  # fmt: skip
    UpstreamFlag(
        "worker_cls",
        _one_of("auto"),
        "'auto' (this engine's own workers)",
        "the worker class is chosen by this engine; upstream worker classes do not fit it",
    ),  # fmt: skip
    UpstreamFlag(
        "worker_extension_cls",
        _one_of(""),
        "'' (none)",
        "worker extension classes are not supported (LLM.collective_rpc runs the methods "
        "of this engine's Worker)",
    ),  # fmt: skip
    UpstreamFlag(
        "model_impl",
        _one_of("auto", "vllm"),
        "'auto' or 'vllm' (this engine's model classes)",
        "the model runs on this engine's own classes only (no Transformers backend)",
    ),  # fmt: skip
    UpstreamFlag(
        "kv_transfer_config",
        _one_of(None),
        "unset",
        "KV-cache transfer connectors (disaggregated prefill, LMCache, offloading) are not "
        "implemented",
    ),  # fmt: skip
    UpstreamFlag("kv_events_config", _one_of(None), "unset", "KV-cache events are not published"),
    UpstreamFlag(
        "otlp_traces_endpoint",
        _one_of(None),
        "unset",
        "OpenTelemetry tracing is not implemented (metrics: /metrics)",
    ),  # fmt: skip
    UpstreamFlag(
        "enable_prompt_embeds",
        _one_of(False),
        "off",
        "prompts are text or token ids; prompt embeddings are not accepted",
    ),  # fmt: skip
    UpstreamFlag(
        "limit_mm_per_prompt",
        _no_media,
        "a count of 0 for every modality (or unset)",
        "multimodal inputs are not supported (text models only)",
    ),  # fmt: skip
    UpstreamFlag(
        "disable_hybrid_kv_cache_manager",
        _one_of(None, True),
        "on (or unset)",
        "every layer gets the same KV cache (a sliding-window layer keeps every position), "
        "as with the switch on; there is no hybrid KV cache manager",
    ),  # fmt: skip
    UpstreamFlag(
        "stream_interval",
        _one_of(1),
        "1",
        "each step's new tokens reach their streams when the step ends",
    ),  # fmt: skip
)

SERVER_FLAGS = (
    UpstreamFlag(
        "api_server_count",
        _one_of(None, 1),
        "1 (or unset)",
        "one API server process runs the engine (run more servers behind a load balancer)",
    ),  # fmt: skip
    UpstreamFlag(
        "headless",
        _one_of(False),
        "off",
        "the engine always runs inside the API server (data parallelism is not implemented)",
    ),  # fmt: skip
    UpstreamFlag("uds", _one_of(None), "unset", "the server listens on TCP only (--host, --port)"),
)


def check_upstream_flags(values: Any, flags: tuple[UpstreamFlag, ...] = ENGINE_FLAGS) -> None:
    """Refuse the first value of ``flags`` (read as attributes of ``values``: EngineArgs or
    the serve namespace) that asks for something missing here.

    Raises:
        ValueError: naming the flag, the value and the supported values.
    """
    for spec in flags:
        value = getattr(values, spec.name)
        if not spec.accepts(value):
            raise ValueError(spec.refusal(value))


def log_ignored_code_revision(model: str, code_revision: str | None) -> None:
    """``code_revision`` (upstream's hub revision of a model's code) names nothing for a
    local path: logged as ignored when set, as ``revision`` is."""
    if code_revision is not None:
        logger.warning(
            "code_revision=%r is ignored: the model is read from the local path %r.",
            code_revision, model,
        )  # fmt: skip
