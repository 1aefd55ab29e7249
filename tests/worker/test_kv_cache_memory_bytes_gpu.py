"""``kv_cache_memory_bytes`` on a real GPU (marked ``gpu``): the cache gets exactly the
bytes asked for whatever ``gpu_memory_utilization`` says, and more than the device has
room for is refused at start-up, naming both sizes."""

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.forked
def test_cuda_cache_takes_the_given_bytes(tiny_llama_dir):
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, device="cuda", max_model_len=128, gpu_memory_utilization=0.05,
              kv_cache_memory_bytes=2**28)  # fmt: skip
    worker = llm.llm_engine.executor.worker
    block = worker.get_cache_block_size_bytes()
    assert llm.llm_engine.cache_config.num_gpu_blocks == 2**28 // block - 1
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4))[0]
    assert len(out.outputs[0].token_ids) == 4
    llm.llm_engine.shutdown()


@pytest.mark.forked
def test_cuda_refuses_more_than_the_room_left(tiny_llama_dir):
    from vllm import LLM

    with pytest.raises(ValueError, match=r"kv_cache_memory_bytes=\d+ \(1024.00 GiB\) does not fit"):
        LLM(tiny_llama_dir, device="cuda", max_model_len=128, kv_cache_memory_bytes=2**40)
