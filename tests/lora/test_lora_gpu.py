"""LoRA adapters under CUDA graphs (marked ``gpu``; skipped without CUDA): the adapter
slots and each token's slot live in static buffers, so replayed graphs (plain, prefill and
decode-loop) serve any mix of adapters. Graphs vs --enforce-eager with the same dtype,
backend and batch composition: exact (docs/design.md); the replay counters prove graphs
ran; the adapters' outputs differ from the base model's, so LoRA ran inside them."""

import pytest

from tests.utils import check_outputs_equal

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 100, 12], [1, 300, 41, 17, 8], [1, 64, 65, 66, 67, 68]]
ADAPTERS = [None, "all", "qv", "all", "qv", None]  # prompt i % 3: each prompt twice, two ways


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cuda", dtype="float32", gpu_memory_utilization=0.3,
               enable_lora=True, max_loras=2, max_lora_rank=8, **kw)  # fmt: skip


def _run(llm, adapters):
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    ids = {"all": 1, "qv": 2}
    loras = [None if a is None else LoRARequest(a, ids[a], adapters[a]) for a in ADAPTERS]
    prompts = [{"prompt_token_ids": PROMPTS[i % len(PROMPTS)]} for i in range(len(ADAPTERS))]
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, sp, lora_request=loras, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]


@pytest.mark.forked
@pytest.mark.parametrize("steps", [1, 8])
def test_lora_graphs_equal_eager(tiny_llama_dir, lora_adapters, steps):
    graph = _llm(tiny_llama_dir, num_scheduler_steps=steps)
    got = _run(graph, lora_adapters)
    snap = graph.llm_engine.decode_step_counters()
    assert sum(snap["graph"][0].values()) > 0, snap
    graph.llm_engine.shutdown()
    del graph
    # the same prompt with and without an adapter continues differently: LoRA ran
    assert all(got[i][0] != got[i + 3][0] for i in range(3))
    eager = _llm(tiny_llama_dir, num_scheduler_steps=steps, enforce_eager=True)
    eager.llm_engine.executor.worker.model_runner.pad_eager_batches = True
    check_outputs_equal(got, _run(eager, lora_adapters), f"graph-ms{steps}", f"eager-ms{steps}")
