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
        stats["finished"] += [why for r in step.finished for why in r.reasons]
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
    """(unfinished requests, blocks in use), on the engine thread: after the last stream
    ended, the step that delivered its output has returned."""

    def state():
        core = engine.engine
        used = sum(s.block_manager.usage() for s in core.schedulers)
        return core.has_unfinished_requests(), used

    return await engine._on_engine(state)


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
    # one reason per sequence: r4's n = 2 sequences both end by length
    assert sorted(async_stats["finished"]) == ["length"] * 4 + ["stop"] * 2
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


@pytest.mark.forked
def test_async_engine_first_tokens_are_not_held(tiny_llama_dir, monkeypatch):
    """A step that gives requests their first token is finished when it returns, outside
    any model call; the decode steps after it are held and finished inside the next call.
    (That the streams equal the loop without the mode is the first test's.)"""
    from vllm.engine.async_steps import EngineSteps

    seen = []  # per finished step: (first tokens in it, finished inside a model call)
    result = EngineSteps._result

    async def main():
        engine = _async_engine(tiny_llama_dir, True, 4, monkeypatch)
        with _traced(engine.engine) as trace:

            def noted(self, sched, outs, times):
                seen.append((len(times.ttft), trace["call"]))
                return result(self, sched, outs, times)

            monkeypatch.setattr(EngineSteps, "_result", noted)
            streams = await _stream_all(engine, _params())
        await engine.shutdown()
        return streams

    streams = asyncio.run(main())
    assert all(s and s[-1][1] for s in streams)  # every request streamed to its finish
    firsts = [inside for n, inside in seen if n]
    decodes = [inside for n, inside in seen if not n]
    assert sum(n for n, _ in seen) == len(PROMPTS)
    assert firsts and not any(firsts)  # never held
    assert sum(decodes) >= 2  # the decode steps still overlap the next call


def _without_logprobs(streams):
    """Streams of ``_key`` tuples without their floats (ids, texts, reasons kept)."""
    return [[(k[0], k[1], tuple(c[:4] for c in k[2])) for k in s] for s in streams]


@pytest.mark.forked
def test_async_engine_abort_while_a_report_is_held(tiny_llama_dir, monkeypatch):
    """A client that leaves after two chunks: its request is dropped from the held report
    and freed; every other stream equals the loop without the mode."""
    stop_after = {1: 2}
    sync, sync_stats, _, sync_state = _run(
        tiny_llama_dir, False, 1, monkeypatch, stop_after=stop_after
    )
    asyn, async_stats, trace, async_state = _run(
        tiny_llama_dir, True, 1, monkeypatch, stop_after=stop_after
    )
    assert len(asyn[1]) == 2 and not asyn[1][-1][1]  # left before it finished
    # When the abort lands depends on the event loop, so the batches after it, and with
    # them the last bits of the logprobs, may differ between runs: compare the rest.
    assert _without_logprobs(asyn) == _without_logprobs(sync)
    assert trace["inside"] >= 3
    # The step the abort lands after varies, and each later step of r1 adds one token
    # and one TPOT: their difference does not vary. The aborted request's last step
    # counts its TPOT though its report was dropped; it is not counted finished.
    assert async_stats["finished"] == sync_stats["finished"]
    assert sorted(async_stats["finished"]) == ["length"] * 4 + ["stop"]  # r4: n = 2
    assert async_stats["ttft"] == sync_stats["ttft"] == len(PROMPTS)
    tokens_less_tpot = [st["generation_tokens"] - st["tpot"] for st in (sync_stats, async_stats)]
    assert tokens_less_tpot[0] == tokens_less_tpot[1]
    assert sync_state == async_state == (False, 0.0)


@pytest.mark.forked
def test_async_engine_failed_call_after_a_held_report(tiny_llama_dir, monkeypatch):
    """The fourth model call raises while the third step's report is held (the first
    step, the prefill, is never held): that report's chunks still reach the streams before
    the failure, as without the mode, and every request is freed."""
    sync, *_ = _run(tiny_llama_dir, False, 1, monkeypatch, fail_call=4)
    asyn, _, trace, state = _run(tiny_llama_dir, True, 1, monkeypatch, fail_call=4)
    assert asyn == sync
    r2, others = asyn[2], asyn[:2] + asyn[3:]
    assert r2[-1][1] and r2[-1][2][0][2] == "stop"  # its stop string came before the failure
    assert all(s[-1] == "RequestFailedError" and len(s) == 4 for s in others)  # 3 chunks
    assert trace["inside"] >= 1 and state == (False, 0.0)


def _runs_with_r1_text_failing(model, monkeypatch, fail_call=None):
    """``_run`` without and with the mode while r1's text fails at its second report."""
    from vllm.engine import step_report

    finish_text_of, calls = step_report.finish_text_of, {"r1": 0}

    def failing_text(group, tokenizer):
        if group.request_id == "r1":
            calls["r1"] += 1
            if calls["r1"] == 2:
                raise RuntimeError("bad text")
        return finish_text_of(group, tokenizer)

    monkeypatch.setattr(step_report, "finish_text_of", failing_text)
    runs = {}
    for mode in (False, True):
        calls["r1"] = 0
        runs[mode] = _run(model, mode, 1, monkeypatch, fail_call=fail_call)
    return runs


@pytest.mark.forked
def test_async_engine_text_failure_counts_as_without_the_mode(tiny_llama_dir, monkeypatch):
    """r1's text fails in a held report while its next step already ran: that step's
    samples for r1 are dropped, and not counted (generation tokens, TTFT, TPOT and
    finish reasons equal those without the mode); the other streams are unchanged."""
    runs = _runs_with_r1_text_failing(tiny_llama_dir, monkeypatch)
    (sync, sync_stats, _, sync_state), (asyn, async_stats, _, async_state) = runs.values()
    assert async_stats == sync_stats
    assert sync_stats["finished"].count("abort") == 1  # r1 only
    assert _without_logprobs(asyn) == _without_logprobs(sync)
    assert asyn[1][-1] == "RequestFailedError"
    assert sync_state == async_state == (False, 0.0)


@pytest.mark.forked
def test_async_engine_text_failure_then_failed_call(tiny_llama_dir, monkeypatch):
    """r1's text fails in the report that the failing third call would deliver: r1 fails
    once (counted finished once, freed once) and r0 fails with the call, as without the
    mode."""
    runs = _runs_with_r1_text_failing(tiny_llama_dir, monkeypatch, fail_call=3)
    (sync, sync_stats, _, sync_state), (asyn, async_stats, _, async_state) = runs.values()
    assert asyn[:2] == sync[:2]
    assert [len(s) for s in asyn[:2]] == [3, 2]  # r0: 2 chunks and the call's error
    assert asyn[0][-1] == asyn[1][-1] == "RequestFailedError"
    assert async_stats["finished"] == sync_stats["finished"]
    assert sorted(async_stats["finished"]).count("abort") == len(PROMPTS) + 1  # r4: n = 2
    assert sync_state == async_state == (False, 0.0)


async def _one_stream(engine, max_tokens, at_chunk, action):
    """Stream one request; at chunk ``at_chunk`` start ``action()`` (a coroutine)
    beside it. Returns the outputs (an error as its type name)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = []
    try:
        async for out in engine.generate(PROMPTS[1], params, "r0"):
            outs.append(out)
            if len(outs) == at_chunk:
                asyncio.ensure_future(action())
    except Exception as e:
        outs.append(type(e).__name__)
    return outs


@pytest.mark.forked
def test_async_engine_shutdown_delivers_the_last_step(tiny_llama_dir, monkeypatch):
    """Shutdown requested while the request's last step runs (its second chunk comes
    from inside that step's call): its final output still reaches the stream, from the
    held report delivered as the loop stops."""

    async def main():
        engine = _async_engine(tiny_llama_dir, True, 1, monkeypatch)
        return await _one_stream(engine, 3, 2, engine.shutdown)

    outs = asyncio.run(main())
    assert len(outs) == 3 and outs[-1].finished, outs
    assert outs[-1].outputs[0].finish_reason == "length"


@pytest.mark.forked
@pytest.mark.parametrize("async_proc", [False, True])
def test_async_engine_abort_all_snapshot_has_its_text(tiny_llama_dir, async_proc, monkeypatch):
    """``abort_all`` (a drain that ran out of time) while a report is held: the final
    outputs' texts cover all their token ids."""

    async def main():
        engine = _async_engine(tiny_llama_dir, async_proc, 4, monkeypatch)
        try:
            return await _one_stream(engine, 60, 2, lambda: engine.abort_all("test")), engine
        finally:
            await engine.shutdown()

    outs, engine = asyncio.run(main())
    last = outs[-1].outputs[0]
    assert outs[-1].finished and last.finish_reason == "abort"
    assert 2 <= len(last.token_ids) < 60
    assert last.text == engine.tokenizer.decode(last.token_ids, skip_special_tokens=True)


@pytest.mark.forked
@pytest.mark.parametrize("async_proc", [False, True])
def test_async_engine_delivery_error_stops_the_loop(tiny_llama_dir, async_proc, monkeypatch):
    """An exception while a step's result is delivered (here the metrics) stops the
    engine: every stream ends with EngineDeadError instead of missing a chunk."""

    async def main():
        engine = _async_engine(tiny_llama_dir, async_proc, 1, monkeypatch)
        record, calls = engine.metrics.record, [0]

        def failing_record(stats):
            calls[0] += bool(stats.generation_tokens)
            if calls[0] == 3:
                raise ValueError("metrics bug")
            record(stats)

        engine.metrics.record = failing_record
        try:
            streams = await asyncio.wait_for(_stream_all(engine, _params()), 120)
        finally:
            await engine.shutdown()
        return streams, engine

    streams, engine = asyncio.run(main())
    assert all(s[-1] == "EngineDeadError" for s in streams), streams
    assert all(len(s) == 3 for s in streams)  # two steps' chunks, then the error
    assert isinstance(engine.errored, ValueError)


@pytest.mark.forked
def test_async_engine_stop_flush_delivery_error_kills_the_engine(tiny_llama_dir, monkeypatch):
    """Shutdown during the last step, and the held report's delivery at the loop's stop
    raises: the engine is marked dead with that error and ``on_dead`` is told."""
    dead = []

    async def main():
        engine = _async_engine(tiny_llama_dir, True, 1, monkeypatch)
        engine.on_dead = dead.append
        deliver = engine._deliver_step

        def failing(outs, failed, stats):
            if any(o.finished for o in outs):
                raise ValueError("delivery bug")
            deliver(outs, failed, stats)

        engine._deliver_step = failing
        return await _one_stream(engine, 3, 2, engine.shutdown), engine

    outs, engine = asyncio.run(main())
    assert outs[-1] == "EngineDeadError" and len(outs) == 3, outs
    assert isinstance(engine.errored, ValueError) and dead == [engine.errored]


@pytest.mark.forked
def test_async_engine_abort_all_error_kills_the_engine(tiny_llama_dir, monkeypatch):
    """``abort_all`` fails on the engine thread while delivering the held report: the
    caller gets the error, and the loop stops (the report is lost, so no stream may wait
    for it) with every stream ended by EngineDeadError."""
    res = {}

    async def main():
        engine = _async_engine(tiny_llama_dir, True, 1, monkeypatch)
        result, failing_now = engine.steps._result, [False]

        def failing_result(*args):
            if failing_now[0]:
                raise ValueError("bug while making outputs")
            return result(*args)

        engine.steps._result = failing_result

        inner = engine._abort_all

        def failing_abort_all():  # on the engine thread: no step runs in between
            failing_now[0] = True
            try:
                return inner()
            finally:
                failing_now[0] = False

        engine._abort_all = failing_abort_all

        async def abort_all():
            try:
                res["abort_all"] = await engine.abort_all("test")
            except ValueError as e:
                res["abort_all"] = e

        try:
            outs = await asyncio.wait_for(_one_stream(engine, 12, 2, abort_all), 60)
            res["running"] = engine.is_running
        finally:
            await engine.shutdown()
        return outs, engine

    outs, engine = asyncio.run(main())
    assert isinstance(res["abort_all"], ValueError), res
    # abort_all starts at chunk 2 (delivered inside step 3's call); the loop may queue
    # step 4 on the engine thread first, which delivers chunk 3, and nothing after it
    assert outs[-1] == "EngineDeadError" and len(outs) <= 4, outs
    assert res["running"] is False and engine.errored is res["abort_all"]


@pytest.mark.forked
def test_async_engine_cancelled_abort_all_still_aborts(tiny_llama_dir, monkeypatch):
    """``abort_all`` cancelled while its engine-thread call waits behind a long step (a
    graceful shutdown's last deadline): the abort still runs, its final output reaches the
    stream, and the engine stays healthy and shuts down cleanly."""
    import time

    res = {}

    async def main():
        engine = _async_engine(tiny_llama_dir, True, 1, monkeypatch)

        async def cancelled_abort_all():
            loop = asyncio.get_running_loop()
            loop.run_in_executor(engine._thread, time.sleep, 1.0)  # a long step
            task = asyncio.ensure_future(engine.abort_all("drain timeout"))
            await asyncio.sleep(0.2)
            task.cancel()
            res["cancelled"] = await asyncio.gather(task, return_exceptions=True)

        outs = await asyncio.wait_for(_one_stream(engine, 200, 2, cancelled_abort_all), 60)
        res["errored"] = engine.errored
        await engine.shutdown()
        res["thread_shut_down"] = engine._thread._shutdown
        return outs

    outs = asyncio.run(main())
    assert isinstance(res["cancelled"][0], asyncio.CancelledError), res
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort", outs[-1]
    assert len(outs[-1].outputs[0].token_ids) < 200
    assert res["errored"] is None and res["thread_shut_down"]
