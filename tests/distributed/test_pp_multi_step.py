"""Multi-step decoding under pipeline parallelism on CPU (gloo, mp executor, float32).

PP = 2 (with chunked prefill) and 3 with ``num_scheduler_steps`` > 1 give
PP = 1's one-token-step tokens exactly (docs/design.md: CPU float32 is exact, PP and
multi-step included), greedy and seeded,
with sequences that stop inside a call (max_tokens and a stop token); and a stage forced to
plan a step differently from stage 0 fails the engine with the plan-agreement error.
"""

import pytest

from tests.utils import check_outputs_equal, completion_tuple, deadline, stage_start_method
from vllm.sampling_params import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [100, 200, 300, 400], [11, 12, 13], [42] * 5, [9, 99, 999]]


def _params(stop_token: int | None = None):
    """Greedy with different lengths (stops inside a 4-step call), one seeded sample, and
    optionally a stop token on the first prompt."""
    ps = [SamplingParams(temperature=0, max_tokens=5 + 3 * i) for i in range(len(PROMPTS))]
    ps[2] = SamplingParams(temperature=0.9, seed=7, max_tokens=13)
    stops = [stop_token] if stop_token is not None else []
    ps[0] = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=stops)
    return ps


def _run(model, params, **kw):
    from vllm import LLM

    llm = LLM(model=model, device="cpu", dtype="float32", **kw)
    try:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        in_flight = llm.llm_engine.max_steps_in_flight
    finally:
        llm.llm_engine.shutdown()
    return [(*completion_tuple(o), o.outputs[0].finish_reason) for o in outs], in_flight


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


@pytest.mark.forked
def test_pp2_pp3_multi_step_equal_pp1_one_step(tiny_llama_dir, monkeypatch):
    """3 layers on 2 stages with chunked prefill at a 5-token budget (mixed steps of one
    pass while prompts are split, then decode calls) and on 3 stages, 4 passes per call:
    the same tokens and finish reasons as PP = 1 with one token per call; a stop token ends
    prompt 0 inside its second call (its 7th token), with nothing kept after it."""
    # The PP = 1 reference runs torch ops in this process (stage_start_method).
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    with deadline(300):
        ref, _ = _run(tiny_llama_dir, _params())
        assert [len(r[0]) for r in ref] == [20, 8, 13, 14, 17]
        assert all(len(set(r[0])) >= 3 for r in ref), "degenerate tiny-model output"
        stop = ref[0][0][6]
        assert stop not in ref[0][0][:6]
        chunked = dict(enable_chunked_prefill=True, max_num_batched_tokens=5, max_num_seqs=5)
        for pp, extra in ((2, chunked), (3, {})):
            out, in_flight = _run(
                tiny_llama_dir,
                _params(stop),
                pipeline_parallel_size=pp,
                num_scheduler_steps=4,
                **extra,
            )
            assert out[0][0] == ref[0][0][:7] and out[0][3] == "stop", out[0]
            check_outputs_equal(ref[1:], out[1:], "pp1 1-step", f"pp{pp} 4-step", PROMPTS[1:])
            assert [o[3] for o in out[1:]] == [r[3] for r in ref[1:]] == ["length"] * 4
            assert in_flight == pp  # every VE had a call in the round


@pytest.mark.forked
def test_plan_disagreement_fails_the_step(tiny_llama_dir, monkeypatch):
    """Stage 1 pads decode batches like a graph (the eager debug switch) while stage 0
    does not: stage 1 sees stage 0's plan header differ and the engine raises naming it."""
    from vllm.worker.model_runner import ModelRunner

    real_init = ModelRunner.__init__

    def init(self, config, device, pp_rank=0, pp_size=1):
        real_init(self, config, device, pp_rank, pp_size)
        self.pad_eager_batches = pp_rank == 1

    monkeypatch.setattr(ModelRunner, "__init__", init)  # forked stages inherit it
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    from vllm import LLM

    with deadline(120):
        llm = LLM(model=tiny_llama_dir, device="cpu", dtype="float32", pipeline_parallel_size=2)
        try:
            with pytest.raises(RuntimeError, match="disagrees with stage 0 on the plan"):
                # 6 prompts: 3 decode rows per VE, padded to 4 on stage 1 only
                prompts = [[5, 6, 7 + i] for i in range(6)]
                llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4))
        finally:
            llm.llm_engine.shutdown()


async def _async_run(model, params):
    """The async engine (``vllm serve``'s) at PP = 2 with 4 passes per call: each request
    starts 20 ms after the previous one; returns its outputs as :func:`_run` does and the
    most calls stage 0 held at once."""
    import asyncio

    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    args = EngineArgs(model=model, device="cpu", dtype="float32", pipeline_parallel_size=2,
                      num_scheduler_steps=4)  # fmt: skip
    engine = AsyncLLMEngine(args, log_requests=False)

    async def one(i):
        await asyncio.sleep(0.02 * i)
        final = None
        async for out in engine.generate({"prompt_token_ids": PROMPTS[i]}, params[i], f"r{i}"):
            final = out
        return (*completion_tuple(final), final.outputs[0].finish_reason)

    try:
        outs = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
        times = engine.engine.executor.collective_rpc("stage_times")
    finally:
        await engine.shutdown()
    return list(outs), times[0]["calls_at_once"]


@pytest.mark.forked
def test_async_engine_pp2_multi_step_stream_equals_pp1(tiny_llama_dir, monkeypatch):
    """The async engine submits each virtual engine's calls on their own; the mp executor's
    stages serve them as a stream (vllm/worker/pp_stream.py), a call joining while the
    other VE's runs: PP = 2 with 4 passes per call gives PP = 1's one-token-step tokens
    and finish reasons, and stage 0 held calls of both VEs at once (their passes
    interleaved, as rounds do for ``LLM``)."""
    import asyncio

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", stage_start_method())
    with deadline(300):
        ref, _ = _run(tiny_llama_dir, _params())
        out, calls_at_once = asyncio.run(_async_run(tiny_llama_dir, _params()))
    check_outputs_equal(ref, out, "pp1 1-step", "async pp2 4-step stream", PROMPTS)
    assert [o[3] for o in out] == [r[3] for r in ref]
    assert calls_at_once == 2
