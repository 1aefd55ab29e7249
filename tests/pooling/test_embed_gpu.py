"""Embeddings on a GPU (marked ``gpu``; skipped without CUDA): a one-prompt prefill may
replay a prefill graph (its prompt padded to the graph's token count), so pooling must
read the real tokens only. Graphs vs --enforce-eager padded alike: exact; vs transformers
in bfloat16: close (docs/design.md)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 100, 12, 14, 77], [1, 300, 41, 17], [1, 64, 65, 66, 67]]


def _embed(model, pooling, **kw):
    from vllm import LLM

    llm = LLM(model=model, device="cuda", dtype="bfloat16", task="embed", max_model_len=128,
              gpu_memory_utilization=0.3, override_pooler_config={"pooling_type": pooling},
              **kw)  # fmt: skip
    runner = llm.llm_engine.executor.worker.model_runner
    if kw.get("enforce_eager"):
        runner.pad_eager_batches = True  # the same padded shapes as the graphs
    outs = [llm.embed({"prompt_token_ids": p}, use_tqdm=False)[0] for p in PROMPTS]  # alone
    counters = llm.llm_engine.decode_step_counters()
    llm.llm_engine.shutdown()
    return [torch.tensor(o.outputs.embedding) for o in outs], counters


@pytest.mark.forked
@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_embedding_graphs_equal_eager_and_close_to_transformers(tiny_llama_hd64_dir, pooling):
    from transformers import AutoModelForCausalLM

    graph, counters = _embed(tiny_llama_hd64_dir, pooling)
    assert sum(counters["prefill_graph"].get(0, {}).values()) > 0, counters
    eager, _ = _embed(tiny_llama_hd64_dir, pooling, enforce_eager=True)
    for g, e in zip(graph, eager):
        assert torch.equal(g, e)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_hd64_dir, dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        for ids, g in zip(PROMPTS, graph):
            h = hf.model(torch.tensor([ids], device="cuda")).last_hidden_state[0].float()
            vec = h[-1] if pooling == "LAST" else h.mean(dim=0)
            ref = torch.nn.functional.normalize(vec, dim=0).cpu()
            assert torch.nn.functional.cosine_similarity(g, ref, dim=0) > 0.999
