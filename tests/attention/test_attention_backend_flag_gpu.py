"""``--attention-backend`` on a real GPU (marked ``gpu``): TORCH_SDPA where the default
would be FLASHINFER (SmolLM2, bfloat16, head size 64), chosen by the flag over
VLLM_ATTENTION_BACKEND, in the worker that runs the model."""

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.forked
def test_flag_picks_the_backend_the_worker_runs(smollm2_gguf, monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    from vllm import LLM, SamplingParams

    llm = LLM(smollm2_gguf, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.2,
              max_model_len=256, attention_backend="torch_sdpa")  # fmt: skip
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.attn_backend_name == "TORCH_SDPA"
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=4))[0]
    assert len(out.outputs[0].token_ids) == 4
    llm.llm_engine.shutdown()
