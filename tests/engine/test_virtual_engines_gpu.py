"""Two virtual engines on one GPU under the async engine, as `vllm serve` runs them.

Regression guarded: with two VEs on one H200 (FLASHINFER, CUDA graphs), 2 of 16 concurrent
requests failed with "Step of virtual engine 1 failed": each VE's model call ran on its own
thread, and two steps overlapped inside the one worker, so one ran with the other's
FlashInfer plan. Every request must complete, both VEs must replay their own graphs, and
each output must be logprobs-close to the same request on a one-VE engine (docs/design.md
"Comparisons": bf16, the batch composition differs between the two runs).
"""

import asyncio

import pytest

from tests.utils import check_logprobs_close, completion_tuple, virtual_engines_override

PROMPTS = [f"Question {i}: what is {i} plus {i + 3}? Answer:" for i in range(16)]
MAX_TOKENS = 96


def _engine(model: str, num_ves: int):
    import os

    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine

    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"
    args = EngineArgs(model=model, dtype="bfloat16", max_num_seqs=16, gpu_memory_utilization=0.3)
    with virtual_engines_override(num_ves):
        return AsyncLLMEngine(args, log_requests=False)


async def _run_all(engine, tag: str):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5, ignore_eos=True)

    async def one(i: int, prompt: str):
        last = None
        async for out in engine.generate(prompt, params, f"{tag}-{i}"):
            last = out
        return last

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))


@pytest.mark.gpu
@pytest.mark.forked
def test_two_virtual_engines_serve_concurrent_requests(smollm2_gguf):
    """16 concurrent requests of 96 tokens on two VEs of one GPU all complete, close to
    a one-VE engine's outputs, with graph replays counted on both VEs."""

    async def run(num_ves: int):
        engine = _engine(smollm2_gguf, num_ves)
        try:
            outs = await _run_all(engine, f"ve{num_ves}")
            counters = engine.engine.decode_step_counters()
            return outs, counters
        finally:
            await engine.shutdown()

    ref, _ = asyncio.run(run(1))
    got, counters = asyncio.run(run(2))
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in got)
    assert all(sum(counters["graph"][ve].values()) > 0 for ve in (0, 1)), counters
    check_logprobs_close(
        [completion_tuple(o) for o in ref],
        [completion_tuple(o) for o in got],
        "one-ve",
        "two-ves",
        PROMPTS,
    )
