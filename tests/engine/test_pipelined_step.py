"""The pipelined step (executors with ``execute_model_async``): a virtual engine's next step
is submitted as soon as its previous step's samples are applied, before that step's texts
and RequestOutputs are made; the outputs are those of plain stepping, and a submit that
fails after a step completed returns that step's outputs before the error is raised.

The uni-process executor is given a future-returning ``execute_model_async`` that records
the order of events, so the test runs in one process.
"""

from concurrent.futures import Future

import pytest

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "Paris"]


def _engine(model, **kw):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(EngineArgs(model=model, device="cpu", **kw))


def _run(engine, max_tokens=6):
    """Greedy token ids per prompt, stepping ``engine`` until it is idle."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[str(i)] for i in range(len(PROMPTS))]


def _pipelined(engine, events, monkeypatch, fail_at=None):
    """Give ``engine`` a future-returning executor call that logs ("submit", n) per
    submitted step and fails the ``fail_at``-th submit (counting from 1) with a
    RuntimeError; each StepReport.finish logs ("finish",)."""
    from vllm.engine import step_report

    executor = engine.executor

    def execute_model_async(request):
        n = sum(1 for e in events if e[0] == "submit") + 1
        if n == fail_at:
            raise RuntimeError(f"submit {n} refused")
        events.append(("submit", n))
        fut = Future()
        fut.set_result(executor.execute_model(request))
        return fut

    executor.execute_model_async = execute_model_async
    engine._pipelined = True
    real_finish = step_report.StepReport.finish

    def finish(self):
        events.append(("finish",))
        return real_finish(self)

    monkeypatch.setattr(step_report.StepReport, "finish", finish)


@pytest.mark.forked
def test_next_step_goes_out_before_the_text(tiny_llama_dir, monkeypatch):
    """With one virtual engine every submit after the first comes before the finish of
    the step it follows, and the tokens equal plain stepping's."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    plain = _run(_engine(tiny_llama_dir))
    engine = _engine(tiny_llama_dir)
    events = []
    _pipelined(engine, events, monkeypatch)
    assert _run(engine) == plain
    kinds = [e[0] for e in events]
    # prefill, then 5 decode steps: each step's finish follows the next step's submit
    assert kinds[:2] == ["submit", "submit"], kinds
    assert kinds.count("submit") == 6, kinds
    for i, kind in enumerate(kinds[1:-1], start=1):
        if kind == "finish":
            assert kinds[i - 1] == "submit", kinds


@pytest.mark.forked
def test_failed_submit_raises_after_the_outputs(tiny_llama_dir, monkeypatch):
    """The third submit raises: the step() that applied the second step's samples returns
    that step's outputs (one new token per request), and the next step() raises the
    submit's error."""
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    engine = _engine(tiny_llama_dir)
    events = []
    _pipelined(engine, events, monkeypatch, fail_at=3)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, sp)
    first = engine.step()  # the prefill: submitted, then step 2 submitted, then finished
    assert [len(o.outputs[0].token_ids) for o in first] == [1] * len(PROMPTS)
    second = engine.step()  # step 2 applied; submitting step 3 fails
    assert [len(o.outputs[0].token_ids) for o in second] == [2] * len(PROMPTS)
    with pytest.raises(RuntimeError, match="submit 3 refused"):
        engine.step()
