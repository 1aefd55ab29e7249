"""``kv_cache_memory_bytes`` (``--kv-cache-memory-bytes``) sizes the KV cache per worker
instead of VLLM_CPU_KVCACHE_SPACE (CPU) or gpu_memory_utilization (CUDA; its room check
is in test_gpu_memory.py), split over the virtual engines like any budget."""

import pytest

from vllm.engine.arg_utils import EngineArgs


def _worker(model: str, num_ves: int, **kw):
    from vllm.worker.worker import Worker

    cfg = EngineArgs(model=model, device="cpu", **kw).create_engine_config()
    cfg.num_virtual_engines_override = num_ves
    w = Worker(cfg)
    w.init_device()
    w.load_model()
    return w


def test_bytes_replace_the_cpu_space_and_split_over_virtual_engines(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    w = _worker(tiny_llama_dir, 2, kv_cache_memory_bytes=10**6)
    block = w.get_cache_block_size_bytes()
    assert w.determine_num_available_blocks() == (10**6 // block) // 2 - 1
    space = _worker(tiny_llama_dir, 2)  # the same worker sized by VLLM_CPU_KVCACHE_SPACE
    assert space.determine_num_available_blocks() == (2**30 // block) // 2 - 1
    override = _worker(tiny_llama_dir, 2, kv_cache_memory_bytes=10**6, num_gpu_blocks_override=8)
    assert override.determine_num_available_blocks() == 4  # the override still wins


@pytest.mark.forked
def test_engine_runs_on_the_given_bytes_and_refuses_too_few(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    block = _worker(tiny_llama_dir, 1).get_cache_block_size_bytes()
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128, kv_cache_memory_bytes=41 * block)
    assert llm.llm_engine.cache_config.num_gpu_blocks == 40  # one is the scratch block
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))[0]
    assert len(out.outputs[0].token_ids) == 4
    llm.llm_engine.shutdown()
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLM(tiny_llama_dir, device="cpu", max_model_len=128, kv_cache_memory_bytes=3 * block)
