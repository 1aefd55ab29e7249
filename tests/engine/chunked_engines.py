"""Helpers of the chunked-prefill engine tests: random token-id prompts and small CPU
engines (16-token blocks, 5 sequences, a 256-block cache, prefix caching off unless a test
turns it on: repeated prompts would otherwise be prefilled from the cache and skip the
chunks under test)."""

import gc
import random

BS = 16


def prompts(lens, seed=0) -> list[dict]:
    """Token-id prompts of the given lengths (ids 10-299, seeded)."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(10, 300) for _ in range(n)]} for n in lens]


def engine(model, **kw):
    """An ``LLM`` on CPU with the defaults above; ``kw`` overrides them."""
    from vllm import LLM

    kw.setdefault("num_gpu_blocks_override", 256)
    kw.setdefault("enable_prefix_caching", False)
    return LLM(model=model, device="cpu", block_size=BS, max_num_seqs=5, **kw)


def close(llm) -> None:
    """Shut ``llm``'s engine down and drop it."""
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
