"""The graph-memory estimate against the real capture on a GPU (marked ``gpu``).

Each engine starts in a fresh process, as `vllm serve` does, so the trial capture does not
reuse memory a previous engine left in the caching allocator. With every virtual engine
counted as a whole one (vllm/cudagraph/memory.py), the estimate must never fall below what
the capture then takes, with one VE and with two on one GPU.
"""

import os

import pytest

from tests.utils import virtual_engines_override

pytestmark = pytest.mark.gpu


@pytest.mark.forked
@pytest.mark.parametrize("num_ves", [1, 2])
def test_estimate_covers_the_capture(smollm2_gguf, num_ves):
    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"
    from vllm import LLM

    with virtual_engines_override(num_ves):
        llm = LLM(model=smollm2_gguf, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3)
    worker = llm.llm_engine.executor.worker
    runner = worker.model_runner.graph_runner
    estimated, captured = worker.estimated_graph_bytes, runner.capture_bytes
    print(
        f"{num_ves} VE(s), {len(runner.captured_sizes(0))} decode sizes per VE: "
        f"estimated {estimated / 2**30:.3f} GiB, captured {captured / 2**30:.3f} GiB"
    )
    assert all(runner.captured_sizes(ve) for ve in range(num_ves))
    assert captured > 0
    assert estimated >= captured, (estimated, captured)
    llm.llm_engine.shutdown()
