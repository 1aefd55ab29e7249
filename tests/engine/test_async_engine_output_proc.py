"""Async output processing in ``AsyncLLMEngine`` (``vllm serve``'s engine loop): a step's
texts and RequestOutputs are made, and streamed, while the next step runs inside the
worker's call (vllm/engine/async_steps.py). Guarded, against the same engine without the
mode: every request's stream chunk by chunk (texts, ids, logprobs, finish and stop
reasons; one-token and multi-step), the step statistics, an abort while a report is held,
a failed model call after a held report, and that every report but the last runs inside
the call and before its read.
"""

import asyncio

import pytest

from tests.engine.test_async_output_proc import PROMPTS, _key, _params, _traced


def _async_engine(model, async_proc, steps, monkeypatch):
    """An AsyncLLMEngine on the CPU with the mode forced to ``async_proc`` (its CUDA
    default), its statistics collected into ``engine.test_stats``."""
    import vllm.engine.arg_utils as arg_utils
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    monkeypatch.setattr(arg_utils, "_async_output_proc", lambda *a: async_proc)
    args = EngineArgs(model=model, device="cpu", num_scheduler_steps=steps, max_model_len=256)
    engine = AsyncLLMEngine(args, log_requests=False)
    assert engine.model_config.use_async_output_proc is async_proc
    stats = {"generation_tokens": 0, "ttft": 0, "tpot": 0, "finished": []}
    deliver = engine._deliver_step

    def counted(outs, failed, step):
        stats["generation_tokens"] += step.generation_tokens
        stats["ttft"] += len(step.ttft)
        stats["tpot"] += len(step.tpot)
        stats["finished"] += [reason for reason, _ in step.finished]
        deliver(outs, failed, step)

    engine._deliver_step = counted
    engine.test_stats = stats
    return engine


async def _stream_all(engine, params, stop_after=None):
    """Every request's stream as a list of ``_key`` tuples (an error as its type name),
    all requests queued in one tick; request i leaves after ``stop_after[i]`` chunks."""
    stop_after = stop_after or {}

    async def one(i):
        chunks = []
        try:
            async for out in engine.generate(PROMPTS[i], params[i], f"r{i}"):
                chunks.append(_key(out))
                if len(chunks) == stop_after.get(i):
                    break
        except Exception as e:
            chunks.append(type(e).__name__)
        return chunks

    return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))


async def _idle_state(engine):
    """(unfinished requests, blocks in use) on the engine thread once the loop is idle."""

    def state():
        core = engine.engine
        used = sum(s.block_manager.usage() for s in core.schedulers)
        return core.has_unfinished_requests(), used

    for _ in range(100):  # the loop may still be flushing the last held report
        busy, used = await engine._on_engine(state)
        if not busy:
            return busy, used
        await asyncio.sleep(0.01)
    return busy, used


def _run(model, async_proc, steps, monkeypatch, stop_token=None, stop_after=None, fail_call=None):
    """One engine over PROMPTS: (streams, statistics, trace, state after the run).
    ``fail_call``: the model call (1-based) that raises."""
    params = _params()
    if stop_token is not None:
        params[3].stop_token_ids = [stop_token]

    async def main():
        engine = _async_engine(model, async_proc, steps, monkeypatch)
        executor = engine.engine.executor
        execute, calls = executor.execute_model, [0]

        def maybe_failing(req):
            calls[0] += 1
            if calls[0] == fail_call:
                raise RuntimeError("device error")
            return execute(req)

        executor.execute_model = maybe_failing
        try:
            with _traced(engine.engine) as trace:
                streams = await _stream_all(engine, params, stop_after)
                state = await _idle_state(engine)
        finally:
            await engine.shutdown()
        return streams, engine.test_stats, trace, state

    return asyncio.run(main())


@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 4])
def test_async_engine_streams_equal_without_the_mode(tiny_llama_dir, steps, monkeypatch):
    """Every chunk of every stream and the step statistics equal the loop without the
    mode; the held reports run inside the next call, before its read."""
    first, *_ = _run(tiny_llama_dir, False, steps, monkeypatch)
    ids = first[3][-1][2][0][0]  # prompt 3's greedy ids
    assert len(set(ids)) >= 4, ids  # a random tiny model that repeats itself proves nothing
    stop = ids[3]
    sync, sync_stats, sync_trace, sync_state = _run(
        tiny_llama_dir, False, steps, monkeypatch, stop_token=stop
    )
    asyn, async_stats, async_trace, async_state = _run(
        tiny_llama_dir, True, steps, monkeypatch, stop_token=stop
    )
    assert asyn == sync
    assert async_stats == sync_stats
    assert sorted(async_stats["finished"]) == ["length"] * 3 + ["stop"] * 2
    assert async_stats["ttft"] == len(PROMPTS) and async_stats["generation_tokens"] > 40
    final = {s[-1][0]: s[-1] for s in sync}
    assert final["r3"][2][0][2:4] == ("stop", stop) and len(final["r3"][2][0][0]) <= 4
    assert final["r2"][2][0][2:4] == ("stop", "e")  # cut by its stop string
    assert final["r0"][2][0][5] is not None and len(final["r4"][2]) == 2  # logprobs, n=2
    assert all(len(s) >= 2 and s[-1][1] for s in sync)  # streamed, then finished
    # Without the mode no report runs inside a call. With it every held report does
    # (each step's but the last's, which the flush step that schedules nothing delivers),
    # before the call reads its sampled rows.
    assert sync_trace["inside"] == 0
    assert async_trace["inside"] >= 3 and async_trace["late"] == 0
    assert async_trace["all_reads"] > 0
    assert sync_state == async_state == (False, 0.0)


def _without_logprobs(streams):
    """Streams of ``_key`` tuples without their floats (ids, texts, reasons kept)."""
    return [[(k[0], k[1], tuple(c[:4] for c in k[2])) for k in s] for s in streams]


@pytest.mark.forked
def test_async_engine_abort_while_a_report_is_held(tiny_llama_dir, monkeypatch):
    """A client that leaves after two chunks: its request is dropped from the held report
    and freed; every other stream equals the loop without the mode."""
    stop_after = {1: 2}
    sync, _, _, sync_state = _run(tiny_llama_dir, False, 1, monkeypatch, stop_after=stop_after)
    asyn, _, trace, async_state = _run(tiny_llama_dir, True, 1, monkeypatch, stop_after=stop_after)
    assert len(asyn[1]) == 2 and not asyn[1][-1][1]  # left before it finished
    # When the abort lands depends on the event loop, so the batches after it, and with
    # them the last bits of the logprobs, may differ between runs: compare the rest.
    assert _without_logprobs(asyn) == _without_logprobs(sync)
    assert trace["inside"] >= 3
    assert sync_state == async_state == (False, 0.0)


@pytest.mark.forked
def test_async_engine_failed_call_after_a_held_report(tiny_llama_dir, monkeypatch):
    """The third model call raises while the second step's report is held: that report's
    chunks still reach the streams before the failure, as without the mode, and every
    request is freed."""
    sync, *_ = _run(tiny_llama_dir, False, 1, monkeypatch, fail_call=3)
    asyn, _, trace, state = _run(tiny_llama_dir, True, 1, monkeypatch, fail_call=3)
    assert asyn == sync
    assert all(s[-1] == "RequestFailedError" and len(s) == 3 for s in asyn)  # 2 chunks, error
    assert trace["inside"] >= 1 and state == (False, 0.0)
