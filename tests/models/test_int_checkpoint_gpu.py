"""GPTQ and AWQ checkpoints dequantized at load on a CUDA device (marked ``gpu``; skipped
without CUDA): bfloat16, CUDA graphs on TORCH_SDPA (no FlashInfer compile for the tiny head
size).

The checkpoints of tests/models/test_int_checkpoint.py: the engine on the quantized one
and on the plain one holding the values it stands for load the same bfloat16 weights, so
with graphs (replayed) they give the same tokens and logprobs exactly; a wrong unpacking,
zero offset or group order on the CUDA load path changes them.
"""

import os

import pytest

from tests.models.test_fp8 import PROMPTS
from tests.models.test_fp8_checkpoint import MAX_TOKENS
from tests.models.test_int_checkpoint import CASES, _write
from tests.utils import check_outputs_equal, vllm_greedy

pytestmark = pytest.mark.gpu


def _run(model: str):
    os.environ["VLLM_ATTENTION_BACKEND"] = "TORCH_SDPA"
    from vllm import LLM

    llm = LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.2,
              max_num_seqs=8)  # fmt: skip
    try:
        out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
        counters = llm.llm_engine.decode_step_counters()
        assert sum(counters["graph"][0].values()) > 0, counters  # decode graphs replayed
        return out, llm.llm_engine.config.model_config
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.forked
@pytest.mark.parametrize("case", ["llama-gptq-4bit-desc_act", "qwen2-awq-tp2"])
def test_int_checkpoint_on_cuda_equals_its_dequantized_twin(case, request, tmp_path):
    fixture, qc, keep = CASES[case]
    q_dir, deq_dir = str(tmp_path / "q"), str(tmp_path / "deq")
    _write(request.getfixturevalue(fixture), q_dir, deq_dir, qc, keep)
    out, mc = _run(q_dir)
    assert mc.checkpoint_int.method == qc["quant_method"]
    expect, _ = _run(deq_dir)
    check_outputs_equal(expect, out, "dequantized-twin", case, PROMPTS)
    assert [lp for _, _, lp in out] == [lp for _, _, lp in expect]
