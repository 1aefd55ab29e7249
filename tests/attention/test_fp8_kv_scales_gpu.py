"""A checkpoint's KV-cache scales with ``--kv-cache-dtype fp8`` on a GPU (marked ``gpu``;
skipped without CUDA).

The tiny head-dim-64 Llama (a head size FlashInfer has) with one k_scale / v_scale per
layer, none of them 1, in bfloat16. FLASHINFER (its wrappers planned with an e4m3 cache and
given the scales in ``run``; the small-decode kernel bypassed) against TORCH_SDPA with the
same cache and scales: check_logprobs_close (docs/design.md: FLASHINFER vs TORCH_SDPA in
16 bits); FLASHINFER's CUDA graphs against its --enforce-eager steps: tokens exact for the
batch of prompts (the scales are Python floats, the same in both), and a prefix-cached
rerun check_logprobs_close.
"""

import gc
import glob
import os

import pytest

from tests.attention.test_fp8_kv_cache import MAX_TOKENS, PROMPTS
from tests.utils import check_logprobs_close, check_outputs_equal, vllm_greedy

pytestmark = pytest.mark.gpu

SCALES = [(0.05, 3.0), (0.08, 2.0), (0.03, 4.0)]  # (k_scale, v_scale) of its 3 layers
SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 4
LONG = [SYSTEM + f"Q: Name a {w}. A:" for w in ("color", "fruit", "planet")]


def _with_scales(model_dir: str, target: str) -> str:
    """A copy of ``model_dir`` whose layers carry ``self_attn.k_scale`` / ``v_scale``
    (float32, shape [1]) of :data:`SCALES`."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, target)
    (path,) = glob.glob(os.path.join(target, "*.safetensors"))
    tensors = load_file(path)
    for i, (k, v) in enumerate(SCALES):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([k])
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([v])
    save_file(tensors, path, metadata={"format": "pt"})
    return target


def _run(model: str, backend: str, **kw) -> dict:
    """Outputs, counters and facts of one engine (shut down before returning)."""
    os.environ["VLLM_ATTENTION_BACKEND"] = backend
    from vllm import LLM
    from vllm.model_executor.layers.kv_scales import kv_scales_of

    llm = LLM(model=model, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
              kv_cache_dtype="fp8", max_num_seqs=16, **kw)  # fmt: skip
    try:
        be = llm.llm_engine.executor.worker.model_runner.attn_backend
        res = dict(batched=vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5))
        res["scales"] = llm.apply_model(kv_scales_of)[0]
        manager = llm.llm_engine.schedulers[0].block_manager
        res["long"] = vllm_greedy(llm, LONG, MAX_TOKENS, logprobs=5)
        hits = manager.num_hit_tokens
        res["again"] = vllm_greedy(llm, LONG, MAX_TOKENS, logprobs=5)
        res["hits"] = manager.num_hit_tokens - hits
        res["counters"] = llm.llm_engine.decode_step_counters()
        if backend == "FLASHINFER":
            res["runs"] = (be.prefill_runs + be.graph_prefill_runs, be.decode_runs,
                           be.small_decode_runs)  # fmt: skip
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    return res


@pytest.mark.forked
def test_flashinfer_with_kv_scales_close_to_torch_sdpa(tiny_llama_hd64_dir, tmp_path):
    """The scales load; FLASHINFER's wrappers ran (prefill and decode, no small-decode
    kernel) and are logprobs-close to TORCH_SDPA with the same scales; graphs replayed and
    equal eager for the batch; a prefix-cache hit stays logprobs-close."""
    import torch

    model = _with_scales(tiny_llama_hd64_dir, str(tmp_path / "scaled"))
    want = [tuple(float(torch.tensor(s, dtype=torch.float32)) for s in p) for p in SCALES]
    sdpa = _run(model, "TORCH_SDPA", enforce_eager=True)
    graph = _run(model, "FLASHINFER")
    assert sdpa["scales"] == graph["scales"] == want
    for ids, _, _ in sdpa["batched"]:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, ids
    prefills, decodes, small = graph["runs"]
    assert prefills > 0 and decodes > 0 and small == 0, graph["runs"]
    assert sum(n for ve in graph["counters"]["graph"].values() for n in ve.values()) > 0
    check_logprobs_close(sdpa["batched"], graph["batched"], "torch-sdpa", "flashinfer", PROMPTS)
    check_logprobs_close(sdpa["long"], graph["long"], "torch-sdpa-long", "flashinfer-long", LONG)
    assert graph["hits"] >= len(LONG) * 16, graph["hits"]
    check_logprobs_close(graph["long"], graph["again"], "flashinfer", "prefix-cached", LONG)

    eager = _run(model, "FLASHINFER", enforce_eager=True)
    assert eager["counters"]["graph"] == {}, eager["counters"]
    check_outputs_equal(graph["batched"], eager["batched"], "fi-graphs", "fi-eager", PROMPTS)
