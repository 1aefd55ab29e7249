"""The multiprocessing executor: KV sizing over stages, dead workers, clean shutdown.

Regressions guarded: an engine that hangs forever when a stage's process dies (it must
fail with the stage's rank within 30 s); worker processes outliving shutdown().
"""

import os
import signal
import time

import psutil
import pytest

from tests.distributed.test_pipeline_parallel_cpu import TINY_PROMPTS
from tests.utils import deadline, stage_start_method


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    # These tests run torch CPU ops (tiny-model fixtures, PP = 1 references) in the process
    # that starts the workers: fork only where that is safe (stage_start_method).
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())


def _workers_left() -> list[psutil.Process]:
    """Live children of this test process, multiprocessing's resource tracker aside (it
    belongs to the interpreter, not to an engine, and exits with it)."""
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        left.append(child)
    return left


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", pipeline_parallel_size=2, **kw)


@pytest.mark.forked
def test_num_gpu_blocks_override_is_per_stage(tiny_llama_dir):
    """num_gpu_blocks_override=64 usable blocks per stage -> 64 // 2 VEs = 32 each (the
    scratch blocks come on top)."""
    llm = _llm(tiny_llama_dir, num_gpu_blocks_override=64, max_model_len=256)
    try:
        assert llm.llm_engine.config.cache_config.num_gpu_blocks == 32
        assert llm.llm_engine.executor.collective_rpc("determine_num_available_blocks") == [
            32,
            32,
        ]
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.forked
@pytest.mark.parametrize("victim", [0, 1])
def test_killed_worker_fails_with_its_rank(tiny_llama_dir, victim):
    """SIGKILL one stage while steps are in flight: the engine raises an error naming the
    stage's rank within 30 s (no hang); later calls raise it at once; shutdown leaves no
    process behind."""
    from vllm import SamplingParams

    llm = _llm(tiny_llama_dir)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    for i, p in enumerate(TINY_PROMPTS):
        engine.add_request(f"req-{i}", p, params)
    engine.step()  # both VEs submitted; the oldest step processed
    os.kill(engine.executor.worker_pids[victim], signal.SIGKILL)
    t0 = time.monotonic()
    with deadline(30):
        with pytest.raises(RuntimeError, match=f"rank {victim}") as info:
            while engine.has_unfinished_requests():
                engine.step()
    assert time.monotonic() - t0 < 30
    assert "died" in str(info.value)
    with pytest.raises(RuntimeError, match=f"rank {victim}"):
        llm.generate(["again"], params, use_tqdm=False)
    engine.shutdown()
    assert _workers_left() == []


@pytest.mark.forked
def test_shutdown_leaves_no_process(tiny_llama_dir):
    """After generate + shutdown no worker process remains; shutdown is idempotent and
    a later call fails with a clear message instead of hanging. Also: KV blocks are the
    minimum over stages (stage 0 caches 2 layers, stage 1 one, so stage 1 fits more;
    stage 0's count is allocated everywhere)."""
    llm = _llm(tiny_llama_dir)
    ex = llm.llm_engine.executor
    per_stage = ex.collective_rpc("determine_num_available_blocks")
    assert per_stage[1] > per_stage[0]
    assert llm.llm_engine.config.cache_config.num_gpu_blocks == per_stage[0]
    pids = list(ex.worker_pids)
    assert len(pids) == 2
    assert {p.pid for p in _workers_left()} >= set(pids)
    out = llm.generate(TINY_PROMPTS[:3], use_tqdm=False)
    assert all(o.finished for o in out)
    llm.llm_engine.shutdown()
    llm.llm_engine.shutdown()
    assert _workers_left() == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(["x"], use_tqdm=False)


class _ExitingWorker:
    """A stage process between closing its files and becoming reapable: its sentinel is
    readable, and ``exitcode`` (a non-blocking poll) stays None for its first
    ``polls_until_reaped`` reads (always None for a live one)."""

    def __init__(self, exiting: bool, polls_until_reaped: int = 3):
        self.sentinel, self._w = os.pipe()
        if exiting:
            os.close(self._w)
        self._exiting, self._polls = exiting, polls_until_reaped

    @property
    def exitcode(self):
        self._polls -= 1
        return -signal.SIGKILL if self._exiting and self._polls < 0 else None

    def join(self, timeout=None):
        raise AssertionError("join blocks once the sentinel is ready; poll exitcode")

    def close(self):
        os.close(self.sentinel)
        if not self._exiting:
            os.close(self._w)


@pytest.mark.parametrize("polls, code", [(3, "-9"), (10**9, "pending")])
def test_neighbour_error_names_the_exiting_stage(polls, code):
    """Stage 1 reports a connection reset while stage 0 is still exiting (sentinel ready,
    not yet reaped): the executor's error names rank 0's death, not rank 1's symptom, with
    its exit code once reapable, or "pending" after a second (never blocking on it)."""
    import threading
    from concurrent.futures import Future

    from vllm.executor.mp_executor import MultiprocessingExecutor
    from vllm.worker import worker_process as wp

    ex = object.__new__(MultiprocessingExecutor)
    ex.workers = [_ExitingWorker(True, polls), _ExitingWorker(False)]
    ex.worker_pids = [101, 102]
    ex._lock = threading.Lock()
    ex._error = None
    step = Future()
    ex._steps, ex._calls = {7: step}, {}
    ex._dispatch((wp.STEP, 7, 1, None, "RuntimeError: Connection reset by peer"))
    for w in ex.workers:
        w.close()
    msg = str(step.exception(timeout=0))
    assert msg.startswith(f"pipeline worker rank 0 (pid 101) died unexpectedly (exit code {code})")
    assert ex._error is step.exception(timeout=0)
