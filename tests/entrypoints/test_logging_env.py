"""``VLLM_LOGGING_LEVEL`` and ``VLLM_CONFIGURE_LOGGING``, upstream's logging variables: the
level of the vllm loggers for ``LLM()`` and the commands, and a switch that leaves logging
to the application. Guards: both were ignored (INFO lines always, a handler always
added)."""

import os
import subprocess
import sys

import pytest

PROBE = (
    "import logging; from vllm.logger import configure_logging; configure_logging(); "
    "v = logging.getLogger('vllm'); print(v.level, len(v.handlers))"
)


def _probe(**env) -> subprocess.CompletedProcess:
    """Run PROBE in a fresh interpreter (logging state is per process) with ``env`` set."""
    full = {**os.environ, **env}
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=full, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "env,want",
    [({}, "20 1"), ({"VLLM_LOGGING_LEVEL": "warning"}, "30 1"),
     ({"VLLM_LOGGING_LEVEL": "DEBUG"}, "10 1"), ({"VLLM_CONFIGURE_LOGGING": "0"}, "0 0")],
)  # fmt: skip
def test_configure_logging_reads_the_variables(env, want):
    r = _probe(**env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


def test_a_bad_level_names_the_variable():
    r = _probe(VLLM_LOGGING_LEVEL="LOUD")
    assert r.returncode == 1
    assert "ValueError: VLLM_LOGGING_LEVEL='LOUD' is invalid: expected one of" in r.stderr


def test_run_batch_logs_at_the_level(tiny_llama_dir, tmp_path):
    """The engine's INFO lines (the start-up summary) show by default and not at WARNING."""
    src = tmp_path / "in.jsonl"
    src.write_text("")
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli", "run-batch", "-i", str(src), "-o",
           str(tmp_path / "out.jsonl"), "--model", tiny_llama_dir, "--device", "cpu",
           "--max-model-len", "64"]  # fmt: skip
    for level, shown in (("INFO", True), ("WARNING", False)):
        env = {**os.environ, "VLLM_LOGGING_LEVEL": level, "VLLM_CPU_KVCACHE_SPACE": "0.05"}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ("Start-up summary" in r.stderr) is shown, r.stderr[-3000:]
