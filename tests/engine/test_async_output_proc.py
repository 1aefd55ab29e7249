"""Async output processing (``use_async_output_proc``): LLMEngine.step applies a step's
tokens before the next schedule but makes their texts and RequestOutputs while the next
step runs, inside the worker's call. Guarded: outputs that differ from synchronous
stepping (texts, token ids, logprobs, finish and stop reasons, with and without
streaming, one-token and multi-step), a report the worker never runs before its read, a
report lost at the end of a run, and the mode being on where it cannot overlap anything.
"""

import argparse
import contextlib

import pytest
import torch

from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs, _async_output_proc

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "1, 2, 3,",
    "def main():",
    "Hello, my name is",
]


def test_async_output_proc_resolution():
    uni, mp = ParallelConfig(), ParallelConfig(pipeline_parallel_size=2)
    assert _async_output_proc(False, "cuda", uni, None)
    assert not _async_output_proc(True, "cuda", uni, None)  # --disable-async-output-proc
    assert not _async_output_proc(False, "cpu", uni, None)  # nothing to overlap on the CPU
    assert not _async_output_proc(False, "cuda", mp, None)  # the mp executor pipelines
    assert not _async_output_proc(False, "cuda", uni, object())  # speculative decoding
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    assert parser.parse_args(["--disable-async-output-proc"]).disable_async_output_proc


def _params():
    """Per prompt: greedy runs that end by length, by a stop token, by a stop string
    (detokenized before the next schedule), with logprobs, and a seeded n=2 sample."""
    from vllm import SamplingParams

    return [
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=["e"]),
        SamplingParams(temperature=0, max_tokens=11, ignore_eos=True, stop_token_ids=[]),
        SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=7, ignore_eos=True),
    ]


def _engine(model, async_proc, steps=1, stream=True):
    from vllm.engine.llm_engine import LLMEngine, get_executor_class

    config = EngineArgs(
        model=model, device="cpu", num_scheduler_steps=steps, max_model_len=256
    ).create_engine_config()
    assert not config.model_config.use_async_output_proc  # the CPU default
    config.model_config.use_async_output_proc = async_proc  # the CUDA default, forced
    engine = LLMEngine(config, get_executor_class(config), log_stats=False)
    engine.stream_outputs = stream
    return engine


@contextlib.contextmanager
def _traced(engine):
    """Count the reports finished inside the executor's call, and those finished after
    the call had read its sampled rows (float64 ``.cpu()``, the one read of a step)."""
    from vllm.engine import step_report

    t = {"call": False, "reads": 0, "all_reads": 0, "finished": 0, "inside": 0, "late": 0}
    execute, finish, cpu = (
        engine.executor.execute_model,
        step_report.StepReport.finish,
        torch.Tensor.cpu,
    )

    def traced_execute(req):
        t["call"], t["reads"] = True, 0
        try:
            return execute(req)
        finally:
            t["call"] = False

    def traced_cpu(self, *a, **k):
        if t["call"] and self.dtype == torch.float64:
            t["reads"] += 1
            t["all_reads"] += 1
        return cpu(self, *a, **k)

    def traced_finish(self):
        if self._outputs is None:
            t["finished"] += 1
            t["inside"] += t["call"]
            t["late"] += t["call"] and t["reads"] > 0
        return finish(self)

    engine.executor.execute_model = traced_execute
    step_report.StepReport.finish = traced_finish
    torch.Tensor.cpu = traced_cpu
    try:
        yield t
    finally:
        step_report.StepReport.finish = finish
        torch.Tensor.cpu = cpu
        engine.executor.execute_model = execute


def _run(model, async_proc, steps, stream, stop_token=None):
    """Every step's outputs of one engine over PROMPTS, as comparable tuples."""
    engine = _engine(model, async_proc, steps, stream)
    params = _params()
    if stop_token is not None:
        params[3].stop_token_ids = [stop_token]
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        engine.add_request(f"r{i}", p, sp)
    with _traced(engine) as trace:
        steps_out = []
        while engine.has_unfinished_requests():
            steps_out.append([_key(o) for o in engine.step()])
    engine.shutdown()
    return steps_out, trace


def _key(out):
    return (
        out.request_id,
        out.finished,
        tuple(
            (
                tuple(c.token_ids),
                c.text,
                c.finish_reason,
                c.stop_reason,
                c.cumulative_logprob,
                None if c.logprobs is None else tuple(tuple(sorted(d)) for d in c.logprobs),
            )
            for c in out.outputs
        ),
    )


@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 4])
def test_async_outputs_equal_sync_one_step_later(tiny_llama_dir, steps):
    sync, _ = _run(tiny_llama_dir, False, steps, stream=True)
    # a stop token that the greedy run of prompt 3 emits at its 4th token
    ids = next(k for s in sync for k in s if k[0] == "r3" and k[1])[2][0][0]
    assert len(set(ids)) >= 4, ids  # a random tiny model that repeats itself proves nothing
    stop = ids[3]
    sync, sync_trace = _run(tiny_llama_dir, False, steps, stream=True, stop_token=stop)
    asyn, async_trace = _run(tiny_llama_dir, True, steps, stream=True, stop_token=stop)
    # Every step's outputs, one step later: the first step() returns none.
    assert asyn[0] == []
    assert asyn[1:] == sync[: len(asyn) - 1]
    assert len(asyn) == len(sync) + 1 and sync[-1] == asyn[-1]
    final = {k[0]: k for s in sync for k in s if k[1]}
    assert final["r3"][2][0][2] == "stop" and final["r3"][2][0][3] == stop
    assert final["r3"][2][0][0][-1] == stop and len(final["r3"][2][0][0]) <= 4
    assert final["r2"][2][0][2:4] == ("stop", "e")  # cut by its stop string
    assert final["r0"][2][0][5] is not None  # logprobs
    assert len(final["r4"][2]) == 2  # n=2
    # Texts are the one-shot decodes (the stop token's text left out), as synchronous
    # stepping with the text made token by token gave them.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    for rid, (_, _, outs) in final.items():
        for ids, text, reason, _, _, _ in outs:
            if rid != "r2":
                kept = ids[:-1] if reason == "stop" else ids
                assert text == tok.decode(kept, skip_special_tokens=True), (rid, text)
    # Synchronous steps finish each report at once, outside the worker. With async
    # processing the worker runs each report between its launch and its read, except two:
    # the last step's, finished by the closing step() that schedules nothing, and that
    # step's own (empty) report.
    assert sync_trace["inside"] == 0
    assert async_trace["inside"] == async_trace["finished"] - 2 >= 3
    # ... before the call's read of its sampled rows (which the trace does see)
    assert async_trace["late"] == 0 and async_trace["all_reads"] > 0


@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 4])
def test_async_outputs_without_streaming(tiny_llama_dir, steps):
    """The offline loop's mode: only finished outputs, texts made once at the end; the
    same outputs as streaming synchronous steps."""
    stream, _ = _run(tiny_llama_dir, False, steps, stream=True)
    quiet_sync, _ = _run(tiny_llama_dir, False, steps, stream=False)
    quiet_async, _ = _run(tiny_llama_dir, True, steps, stream=False)
    final = sorted(k for s in stream for k in s if k[1])
    assert sorted(k for s in quiet_sync for k in s) == final
    assert sorted(k for s in quiet_async for k in s) == final
    assert all(k[2][0][1] for k in final)  # texts were made


def _greedy(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def _drain(engine, limit=100):
    finished = []
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        finished += [(o.request_id, o.outputs[0].finish_reason, len(o.outputs[0].token_ids))
                     for o in engine.step() if o.finished]  # fmt: skip
    return finished


@pytest.mark.forked
@pytest.mark.parametrize("async_proc", [False, True])
def test_text_error_fails_one_request_and_frees_it(tiny_llama_dir, async_proc, monkeypatch):
    """A detokenization that raises in the second half (the report, inside the worker's
    call with async processing) fails that request alone: reported finished as aborted
    exactly once, its error kept, freed in the engine and the worker (regression: it was
    left in the engine's requests and never freed, or reported twice)."""
    from vllm.engine import output_processor

    decode = output_processor.decode_sequence_step

    def failing(tok, seq, params):
        if seq.seq_id == 0 and seq.get_output_len() >= 3:
            raise RuntimeError("decode failed")
        return decode(tok, seq, params)

    monkeypatch.setattr(output_processor, "decode_sequence_step", failing)
    engine = _engine(tiny_llama_dir, async_proc)
    freed = []
    free = engine.executor.free_sequences
    engine.executor.free_sequences = lambda ids: (freed.extend(ids), free(ids))[1]
    engine.add_request("r0", PROMPTS[0], _greedy(8))
    engine.add_request("r1", PROMPTS[1], _greedy(8))
    finished = _drain(engine)
    assert sorted(finished) == [("r0", "abort", 3), ("r1", "length", 8)]
    assert str(engine.failed_requests["r0"]) == "decode failed"
    assert engine._requests == {} and sorted(freed) == [0, 1]
    assert not engine.executor.worker.model_runner.generators
    engine.add_request("r0", PROMPTS[0], _greedy(2))  # the id is free again
    assert _drain(engine) == [("r0", "length", 2)]


@pytest.mark.forked
def test_abort_between_steps_leaves_no_output(tiny_llama_dir):
    """A request aborted while its last step's report waits gets no output from it
    (synchronous stepping never returns one after an abort)."""
    engine = _engine(tiny_llama_dir, True)
    engine.add_request("r0", PROMPTS[0], _greedy(8))
    engine.add_request("r1", PROMPTS[1], _greedy(8))
    engine.step()
    engine.step()
    assert engine._reports
    engine.abort_request("r0")
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.request_id for o in engine.step()]
    assert "r0" not in seen and "r1" in seen


@pytest.mark.forked
def test_step_error_keeps_the_previous_steps_outputs(tiny_llama_dir):
    """When a step's execution raises, the outputs of the step before it (already
    processed) are returned by a later step() instead of being lost."""
    sync = _engine(tiny_llama_dir, False)
    sync.add_request("r0", PROMPTS[0], _greedy(2))
    sync.add_request("r1", PROMPTS[1], _greedy(6))
    want = sorted(_drain(sync))
    sync.shutdown()
    engine = _engine(tiny_llama_dir, True)
    engine.add_request("r0", PROMPTS[0], _greedy(2))
    engine.add_request("r1", PROMPTS[1], _greedy(6))
    execute = engine.executor.execute_model
    calls = {"n": 0}

    def flaky(req):
        calls["n"] += 1
        if calls["n"] == 3:  # r0 finished in step 2, whose report waits
            raise RuntimeError("device error")
        return execute(req)

    engine.executor.execute_model = flaky
    finished = _drain(engine, limit=2)
    with pytest.raises(RuntimeError, match="device error"):
        engine.step()
    finished += _drain(engine)
    assert sorted(finished) == want and ("r0", "length", 2) in want


@pytest.mark.gpu
@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 8])
def test_async_output_proc_on_cuda_equals_disabled(smollm2_gguf, steps):
    """On CUDA the mode is on by default, the worker runs each report between launch and
    read (one-token steps, and decode-loop graph calls with ``steps`` = 8), and the
    outputs equal ``--disable-async-output-proc``'s exactly (same kernels, same batches)."""
    from vllm import LLM, SamplingParams

    new_tokens = 24
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompts = PROMPTS * 4
    outs = {}
    for disabled in (False, True):
        llm = LLM(model=smollm2_gguf, device="cuda", dtype="bfloat16",
                  gpu_memory_utilization=0.3, num_scheduler_steps=steps,
                  disable_async_output_proc=disabled)  # fmt: skip
        engine = llm.llm_engine
        assert engine.model_config.use_async_output_proc is not disabled
        with _traced(engine) as trace:
            got = llm.generate(prompts, params, use_tqdm=False)
        outs[disabled] = [(o.outputs[0].token_ids, o.outputs[0].text) for o in got]
        # every decode call runs the report of the step before it (the prefill's first)
        decode_calls = -(-(new_tokens - 1) // steps)
        assert trace["inside"] >= (0 if disabled else decode_calls)
        assert not disabled or trace["inside"] == 0
        assert trace["late"] == 0
        engine.shutdown()
        del llm
    assert outs[False] == outs[True]
    assert all(len(set(ids)) >= 4 for ids, _ in outs[False])
