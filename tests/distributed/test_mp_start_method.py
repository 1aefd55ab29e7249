"""How the mp executor starts its stage processes (vllm/executor/mp_executor.py).

A script that builds ``LLM(..., pipeline_parallel_size=2)`` at its top level, without an
``if __name__ == "__main__":`` guard, or comes from stdin (``python -``), used to fail with
"its process exited during start-up" and nothing else: under spawn each worker re-imports
the main module and multiprocessing stops the second engine start. Workers are now forked
when CUDA is not initialised; when spawn fails this way the error names the guard and the
worker's real exit code.
"""

import ast
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    from vllm import LLM, SamplingParams

    llm = LLM(model={model!r}, device="cpu", dtype="float32", pipeline_parallel_size=2)
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = llm.generate(["The capital of France is"], sp, use_tqdm=False)[0].outputs[0]
    print("IDS", list(out.token_ids))
    llm.llm_engine.shutdown()
    """
)


def _run_script(tmp_path, model, how: str, env: dict, timeout: float = 300):
    """Run SCRIPT in a fresh interpreter (as a file or from stdin); kill its whole process
    group if it outlives ``timeout`` seconds. Returns (exit code, stdout, stderr)."""
    code = SCRIPT.format(model=model)
    if how == "file":
        path = tmp_path / "pp_script.py"
        path.write_text(code)
        cmd, stdin = [sys.executable, str(path)], None
    else:
        cmd, stdin = [sys.executable, "-"], code
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.05", "HF_HUB_OFFLINE": "1", **env}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env["PYTHONPATH"] = os.pathsep.join([root, full_env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=full_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script did not finish in {timeout} s:\n{err[-3000:]}")
    return proc.returncode, out, err


def _reference_ids(model) -> list[int]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, device="cpu", dtype="float32")
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = list(
        llm.generate(["The capital of France is"], sp, use_tqdm=False)[0].outputs[0].token_ids
    )
    llm.llm_engine.shutdown()
    return ids


@pytest.mark.forked
@pytest.mark.parametrize("how", ["file", "stdin"])
def test_guardless_script_pp2_runs_with_fork(tiny_llama_dir, tmp_path, monkeypatch, how):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    rc, out, err = _run_script(tmp_path, tiny_llama_dir, how, {})
    assert rc == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("IDS "))
    ids = ast.literal_eval(line[4:])  # a printed list of ints
    assert len(ids) == 12 and len(set(ids)) >= 4
    assert ids == _reference_ids(tiny_llama_dir)  # PP = 2 is exact vs PP = 1 on CPU


@pytest.mark.forked
def test_guardless_script_under_spawn_names_the_guard(tiny_llama_dir, tmp_path):
    rc, _, err = _run_script(
        tmp_path, tiny_llama_dir, "file", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    )
    assert rc != 0
    # whichever stage's process exits first is reported: both re-import the guard-less script
    assert re.search(r"pipeline worker rank [01] failed to start", err), err[-3000:]
    assert "exit code 1)" in err  # the worker's real exit code, not None
    assert 'if __name__ == "__main__":' in err
    # multiprocessing's own explanation, from the worker, is still there
    assert "bootstrapping phase" in err


def test_start_up_exit_message():
    from vllm.executor.mp_executor import start_up_exit_message

    spawn = start_up_exit_message(1, 1, "spawn")
    assert spawn.startswith(
        "pipeline worker rank 1 failed to start: its process exited during start-up (exit code 1)."
    )
    assert '`if __name__ == "__main__":` guard' in spawn
    fork = start_up_exit_message(0, -9, "fork")
    assert fork.endswith("(exit code -9).")
    assert "__main__" not in fork


def test_worker_start_method(monkeypatch):
    import torch

    from vllm.executor import mp_executor

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert mp_executor.worker_start_method() == "fork"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert mp_executor.worker_start_method() == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert mp_executor.worker_start_method() == "spawn"  # CUDA in the parent: never fork
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "forkserver")
    with pytest.raises(ValueError, match="VLLM_WORKER_MULTIPROC_METHOD.*'forkserver'"):
        mp_executor.worker_start_method()
