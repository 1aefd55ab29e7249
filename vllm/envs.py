"""Every environment variable the engine reads, declared once.

Each entry names the variable, its type and default, and says in one line what it does. A
variable is parsed by its entry's parser on each access (``vllm.envs.VLLM_USE_TRITON_OPS``),
so a test that sets it with ``monkeypatch.setenv`` sees the new value, and a value that does
not parse raises a ValueError naming the variable and the value. Nothing else in ``vllm/``
reads ``os.environ``; the README lists these variables (``python -m vllm.envs`` prints them).

Switches that change what is captured or how the KV budget is computed are config fields with
CLI flags instead (``--prefill-graph-max-tokens``, ``--disable-decode-loop-graphs``,
``--small-decode-max-rows``): see :class:`vllm.config.CompilationConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def parse_flag(raw: str) -> bool:
    """ "1"/"true"/"yes"/"on" -> True, "0"/"false"/"no"/"off" -> False (case-insensitive).

    Raises:
        ValueError: any other text.
    """
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0 (or true/false)")


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


CPU_KVCACHE_SPACE_DEFAULT_GIB = 4.0  # upstream's default


def _cpu_kv_space_gib(raw: str) -> float:
    """GiB of CPU KV cache: a number > 0, or 0 for the default 4 GiB (upstream reads 0, its
    own default value, as "not set")."""
    value = float(raw)
    if value == 0:
        return CPU_KVCACHE_SPACE_DEFAULT_GIB
    if not value > 0:
        raise ValueError("expected a number >= 0 (0: the default 4 GiB)")
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _str(raw: str) -> str:
    return raw


_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def _log_level(raw: str) -> str:
    """A logging level name (any case): CRITICAL, ERROR, WARNING, INFO or DEBUG."""
    name = raw.strip().upper()
    if name not in _LEVELS:
        raise ValueError(f"expected one of {list(_LEVELS)}")
    return name


def _omp_threads(raw: str) -> int:
    """OpenMP's thread count: the outer level of a nested list ("4,2" -> 4), at least 1."""
    first = raw.split(",")[0].strip().lstrip("+")
    if not first.isdigit() or int(first) < 1:
        raise ValueError("expected a positive integer")
    return int(first)


@dataclass(frozen=True)
class EnvVar:
    """One declared environment variable.

    Args:
        name: the variable's name.
        parse: str -> value; raises ValueError on a bad value.
        default: the value when the variable is unset or empty (None: no value).
        doc: one line for the README and ``python -m vllm.envs``.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str

    def read(self) -> Any:
        """The variable's current value.

        Raises:
            ValueError: naming the variable and the value it could not parse.
        """
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.name}={raw!r} is invalid: {e}.") from None


_DECLARED = (
    EnvVar(
        "VLLM_ATTENTION_BACKEND",
        _str,
        None,
        "Attention backend: FLASHINFER or TORCH_SDPA (default: FLASHINFER on CUDA if "
        "installed); `--attention-backend` wins over it.",
    ),
    EnvVar(
        "VLLM_CPU_KVCACHE_SPACE",
        _cpu_kv_space_gib,
        CPU_KVCACHE_SPACE_DEFAULT_GIB,
        "KV-cache size on CPU in GiB (default 4, as upstream; 0 also means 4).",
    ),
    EnvVar(
        "VLLM_CACHE_ROOT",
        _str,
        None,
        "Directory of on-disk caches (GGUF config and tokenizer); default ~/.cache/vllm.",
    ),
    EnvVar("VLLM_API_KEY", _str, None, "API key `vllm serve` requires when --api-key is unset."),
    EnvVar(
        "VLLM_LOGGING_LEVEL",
        _log_level,
        "INFO",
        "Level of the vllm loggers (DEBUG, INFO, WARNING, ERROR, CRITICAL), as upstream; "
        "`vllm serve --debug` is DEBUG.",
    ),
    EnvVar(
        "VLLM_CONFIGURE_LOGGING",
        parse_flag,
        True,
        "0 leaves logging alone (no handler, no level set), for applications that "
        "configure it themselves, as upstream.",
    ),
    EnvVar(
        "VLLM_USE_TRITON_OPS",
        parse_flag,
        True,
        "0 replaces the fused Triton norm / rotary / SiLU kernels by torch ops on CUDA.",
    ),
    EnvVar(
        "VLLM_USE_TRITON_GEMV",
        parse_flag,
        True,
        "0 replaces the Triton GEMV kernels of small decode batches by cuBLAS matmuls.",
    ),
    EnvVar(
        "VLLM_USE_TRITON_GREEDY",
        parse_flag,
        True,
        "0 replaces the Triton greedy-sampling kernel by torch.argmax.",
    ),
    EnvVar(
        "VLLM_TRITON_PDL",
        parse_flag,
        True,
        "0 launches Triton kernels without programmatic dependent launch (Hopper and later).",
    ),
    EnvVar(
        "VLLM_TRITON_L2_PREFETCH_MB",
        _non_negative_int,
        0,
        "MiB of weights a one-row projection launch prefetches into L2 before its PDL wait "
        "(0: none).",
    ),
    EnvVar(
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        parse_flag,
        False,
        "1 allows --max-model-len above the model's context limit (max_position_embeddings, "
        "times a linear RoPE scaling's factor; with yarn, original_max_position_embeddings "
        "times the factor; with a warning); the RoPE scaling stays the config's, its tables "
        "cover max_model_len positions.",
    ),
    EnvVar(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        parse_flag,
        False,
        "1 enables vllm serve's POST /v1/load_lora_adapter and /v1/unload_lora_adapter.",
    ),
    EnvVar(
        "VLLM_SERVER_DEV_MODE",
        parse_flag,
        False,
        "1 enables vllm serve's development routes (POST /reset_prefix_cache), open to "
        "every client whatever --api-key says, and turns --log-error-stack on unless "
        "--no-log-error-stack; not for production.",
    ),
    EnvVar(
        "VLLM_TORCH_PROFILER_DIR",
        _str,
        None,
        "Directory of torch profiler traces; enables LLM.start_profile() and the server's "
        "POST /start_profile and /stop_profile.",
    ),
    EnvVar(
        "VLLM_PP_LAYER_PARTITION",
        _str,
        None,
        "Comma-separated layer counts per pipeline stage, e.g. '10,20' (default: even split).",
    ),
    EnvVar(
        "VLLM_RAY_STARTUP_TIMEOUT_S",
        _positive_float,
        600.0,
        "Seconds the Ray executor waits for its workers to start.",
    ),
    EnvVar(
        "VLLM_RAY_PG_TIMEOUT_S",
        _positive_float,
        60.0,
        "Seconds the Ray executor waits for its placement group.",
    ),
    EnvVar(
        "VLLM_RAY_PG_STRATEGY",
        _str,
        None,
        "Ray placement-group strategy (default STRICT_PACK when one node fits, else PACK).",
    ),
    EnvVar(
        "VLLM_WORKER_MULTIPROC_METHOD",
        _str,
        None,
        "fork or spawn for pipeline worker processes (default: fork unless CUDA is initialised).",
    ),
    EnvVar(
        "VLLM_PP_HOST_CHANNELS",
        parse_flag,
        True,
        "mp executor: host data between stages through shared memory (0: gloo, as Ray).",
    ),
    EnvVar("RAY_ADDRESS", _str, None, "Ray's own: the cluster the Ray executor joins."),
    EnvVar(
        "OPENAI_API_KEY",
        _str,
        None,
        "The API key `vllm chat` / `vllm complete` send when --api-key is unset.",
    ),
    EnvVar(
        "CUDA_VISIBLE_DEVICES",
        _str,
        None,
        "CUDA's own: the GPUs this process sees (`vllm collect-env` shows it).",
    ),
    EnvVar(
        "OMP_NUM_THREADS",
        _omp_threads,
        None,
        "OpenMP's own, read where the engine starts: intra-op threads of each CPU worker "
        "(default: the worker host's cores / ranks).",
    ),
    EnvVar(
        "TRITON_INTERPRET",
        parse_flag,
        False,
        "Triton's own: 1 runs Triton kernels under its CPU interpreter (tests).",
    ),
)

ENV_VARS: dict[str, EnvVar] = {v.name: v for v in _DECLARED}


def __getattr__(name: str) -> Any:
    """``vllm.envs.NAME``: the declared variable's current value."""
    var = ENV_VARS.get(name)
    if var is None:
        raise AttributeError(f"module 'vllm.envs' has no attribute {name!r}")
    return var.read()


def vllm_variables_set() -> list[tuple[str, str]]:
    """(name, raw value) of every ``VLLM_*`` variable set in the environment, declared or
    not (a misspelt one shows up here), sorted by name; for ``vllm collect-env``."""
    return sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_"))


def __dir__() -> list[str]:
    return sorted([*globals(), *ENV_VARS])


def describe() -> str:
    """A Markdown table of every variable (name, default, doc), as the README lists them."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for v in _DECLARED:
        default = "unset" if v.default is None else repr(v.default)
        rows.append(f"| `{v.name}` | {default} | {v.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(describe())
