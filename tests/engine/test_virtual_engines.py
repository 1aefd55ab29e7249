"""Several virtual engines on one device, and failed steps.

- Steps of two virtual engines (VEs) on ONE worker must not overlap. The async engine runs
  each VE's model call on its own thread; the single Worker keeps shared state between
  input preparation and the forward (FlashInfer's eager wrappers are planned in one and run
  in the other), so an overlapped step ran with the other VE's plan: wrong tokens, or a
  failed step (2 of 16 requests failed under `vllm serve` with two VEs on one GPU).
- A failed step logs its exception with the traceback, also when the failure comes from a
  VE thread or an executor future (it used to log "NoneType: None").
"""

import asyncio
import logging
import threading
from concurrent.futures import Future

import pytest

from tests.utils import run_engine_script, virtual_engines_override

PROMPTS = [f"Request number {i} says hello to" for i in range(16)]


def _async_engine(model, num_ves, **kw):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    with virtual_engines_override(num_ves):
        return AsyncLLMEngine(
            EngineArgs(model=model, device="cpu", max_num_seqs=16, **kw), log_requests=False
        )


async def _generate_all(engine, prompts, max_tokens, tag):
    """Token ids per prompt (or the exception its stream raised), all requests at once."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    async def one(i, prompt):
        last = None
        try:
            async for out in engine.generate(prompt, sp, f"{tag}-{i}"):
                last = out
        except Exception as e:
            return e
        return list(last.outputs[0].token_ids)

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _fake_flashinfer(monkeypatch):
    """Every ModelRunner gets the production FlashInfer backend with fake wrappers (CPU):
    the backend whose shared eager wrappers two overlapped VE steps corrupt."""
    from tests.worker.fakes import FakeDecodeWrapper, FakePrefillWrapper
    from vllm.attention.backends.flashinfer import FlashInferBackend
    from vllm.worker.model_runner import ModelRunner

    original = ModelRunner.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.attn_backend = FlashInferBackend(self.attn_spec, FakePrefillWrapper, FakeDecodeWrapper)
        self.attn_backend.small_max_rows = 0  # every decode through the (fake) wrappers

    monkeypatch.setattr(ModelRunner, "__init__", init)


@pytest.mark.forked
def test_two_virtual_engines_one_device_match_one(tiny_llama_dir, monkeypatch):
    """16 concurrent requests, three rounds, on two VEs sharing one worker with the
    FlashInfer backend: every request's greedy tokens equal the single-VE run's. Before the
    uniproc executor serialised steps, a round typically had several requests differ."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.1")
    _fake_flashinfer(monkeypatch)

    async def run(num_ves, rounds):
        engine = _async_engine(tiny_llama_dir, num_ves)
        try:
            return [await _generate_all(engine, PROMPTS, 24, f"round{r}") for r in range(rounds)]
        finally:
            await engine.shutdown()

    (expected,) = asyncio.run(run(1, 1))
    assert all(isinstance(ids, list) and len(ids) == 24 for ids in expected), expected
    assert len({tuple(ids) for ids in expected}) == len(PROMPTS)  # distinct outputs
    for r, got in enumerate(asyncio.run(run(2, 3))):
        bad = [i for i in range(len(PROMPTS)) if got[i] != expected[i]]
        assert not bad, f"round {r}: requests {bad} differ from the single-VE run"


@pytest.mark.forked
@pytest.mark.parametrize("second", ["execute_model", "free_sequences"])
def test_uniproc_worker_calls_never_overlap(tiny_llama_dir, monkeypatch, second):
    """Instrumented worker: the first execute_model waits (up to 3 s) for a second call
    from another thread to enter the worker. Serialised, the second call cannot enter until
    the first returns, so at most one call is ever inside the worker."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.executor.uniproc_executor import UniProcExecutor
    from vllm.sequence import ExecuteModelRequest

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    with virtual_engines_override(2):
        config = EngineArgs(model=tiny_llama_dir, device="cpu").create_engine_config()
    executor = UniProcExecutor(config)
    worker = executor.worker
    guard = threading.Lock()
    state = {"inside": 0, "peak": 0, "entered": 0}
    second_entered = threading.Event()

    def instrument(fn):
        def call(*args):
            with guard:
                state["inside"] += 1
                state["peak"] = max(state["peak"], state["inside"])
                state["entered"] += 1
                first = state["entered"] == 1
            if first:
                second_entered.wait(timeout=3.0)
            else:
                second_entered.set()
            try:
                return fn(*args)
            finally:
                with guard:
                    state["inside"] -= 1

        return call

    monkeypatch.setattr(worker, "execute_model", instrument(worker.execute_model))
    monkeypatch.setattr(worker, "free_sequences", instrument(worker.free_sequences))
    t0 = threading.Thread(
        target=executor.execute_model, args=(ExecuteModelRequest([], virtual_engine=0),)
    )
    t0.start()
    while state["entered"] == 0:
        threading.Event().wait(0.01)
    if second == "execute_model":
        t1 = threading.Thread(
            target=executor.execute_model, args=(ExecuteModelRequest([], virtual_engine=1),)
        )
    else:
        t1 = threading.Thread(target=executor.free_sequences, args=([123],))
    t1.start()
    t0.join()
    t1.join()
    executor.shutdown()
    assert state["entered"] == 2
    assert state["peak"] == 1, "two calls were inside the one worker at once"


def _injected_step_error():
    raise RuntimeError("injected step failure 5be1")


@pytest.mark.forked
@pytest.mark.parametrize("path", ["ve_thread", "executor_future", "whole_step"])
def test_failed_step_logs_its_traceback(tiny_llama_dir, monkeypatch, caplog, path):
    """A step of VE 1 raises (from the VE thread, from the executor's future, or inside
    the single-VE whole step); the log has the exception and its traceback, the request
    of that step fails and the other VE's request completes."""
    from vllm.engine.async_llm_engine import RequestFailedError

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    num_ves = 1 if path == "whole_step" else 2
    failing_ve = 0 if path == "whole_step" else 1
    engine = _async_engine(tiny_llama_dir, num_ves, skip_tokenizer_init=True)
    executor = engine.engine.executor
    real = executor.execute_model
    doomed = "b-0" if path == "whole_step" else "r-1"  # alone in its steps, on failing_ve

    def execute_model(request):
        if any(md.request_id == doomed for md in request.seq_group_metadata_list):
            assert request.virtual_engine == failing_ve
            _injected_step_error()
        return real(request)

    monkeypatch.setattr(executor, "execute_model", execute_model)
    if path == "executor_future":

        def execute_model_async(request):
            fut = Future()
            try:
                fut.set_result(execute_model(request))
            except Exception as e:
                fut.set_exception(e)
            return fut

        monkeypatch.setattr(executor, "execute_model_async", execute_model_async, raising=False)

    async def main():
        try:
            if path == "whole_step":  # r0 first, then r1 alone in its own step
                first = await _generate_all(engine, [{"prompt_token_ids": [5, 6, 7]}], 4, "a")
                second = await _generate_all(engine, [{"prompt_token_ids": [8, 9]}], 4, "b")
                return first + second
            prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
            return await _generate_all(engine, prompts, 4, "r")
        finally:
            await engine.shutdown()

    with caplog.at_level(logging.ERROR, logger="vllm.engine.async_llm_engine"):
        ok, failed = asyncio.run(main())
    assert isinstance(ok, list) and len(ok) == 4, ok
    assert isinstance(failed, RequestFailedError) and "injected step failure 5be1" in str(failed)
    records = [r for r in caplog.records if "failed; failing its requests" in r.getMessage()]
    assert [r.getMessage() for r in records] == [
        f"Step of virtual engine {failing_ve} failed; failing its requests."
    ]
    text = caplog.text
    assert "NoneType: None" not in text
    assert "Traceback (most recent call last)" in text
    assert "in _injected_step_error" in text
    assert "RuntimeError: injected step failure 5be1" in text


MP_SCRIPT = """
import asyncio, logging, sys
from vllm.worker.worker import Worker

logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
real = Worker.stream_calls  # how the mp executor's stages run steps at TP = 1

def _stage_fault(self, tag, request, *args):
    if self.rank == 1 and any(md.request_id == "doomed" for md in request.seq_group_metadata_list):
        raise RuntimeError("injected stage failure 9c2d")
    return real(self, tag, request, *args)

Worker.stream_calls = _stage_fault  # forked stage processes inherit it

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine

async def main():
    args = EngineArgs(model=sys.argv[1], device="cpu", pipeline_parallel_size=2)
    engine = AsyncLLMEngine(args, log_requests=False)
    sp = SamplingParams(temperature=0.0, max_tokens=3)
    try:
        async for _ in engine.generate({"prompt_token_ids": [5, 6]}, sp, "doomed"):
            pass
    except Exception as e:
        print("REQUEST FAILED", type(e).__name__)
    await engine.shutdown()

asyncio.run(main())
"""


@pytest.mark.forked
def test_failed_mp_step_logs_the_workers_traceback(tiny_llama_dir, tmp_path):
    """PP = 2 under the mp executor (forked stages): a stage's exception reaches the log of
    the failed step with the worker's own traceback (the executor's error carries it)."""
    proc = run_engine_script(MP_SCRIPT, tiny_llama_dir, cwd=tmp_path, timeout=300)
    assert "REQUEST FAILED RequestFailedError" in proc.stdout, proc.stderr[-3000:]
    err = proc.stderr
    start = err.index("Step of virtual engine 0 failed; failing its requests.")
    logged = err[start:]
    assert "NoneType: None" not in logged
    assert "Traceback (most recent call last)" in logged
    assert "in _stage_fault" in logged  # the worker's frame, from the stage process
    assert "RuntimeError: injected stage failure 9c2d" in logged
