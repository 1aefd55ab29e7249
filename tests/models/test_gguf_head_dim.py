"""A GGUF file's head size (``{arch}.attention.key_length``) is the config's ``head_dim``:
transformers' GGUF reader does not map it for qwen3 and keeps Qwen3Config's default 128, so
a qwen3 GGUF with another head size failed to load ("the parameter expects (128,)"). The
reference is transformers on the Hugging Face checkpoint the GGUF was written from (same
float32 weights; transformers on the GGUF fails the same way)."""

import pytest

from tests.utils import check_outputs_equal, hf_greedy, vllm_greedy

PROMPTS = [
    {"prompt_token_ids": [19556, 905]},
    {"prompt_token_ids": [504, 3575, 282, 4649, 314, 253, 2528, 335, 260, 5246, 35423, 28]},
    {"prompt_token_ids": [17 + 7 * i for i in range(20)]},
]
MAX_TOKENS = 24
LOGPROB_TOL = 1e-4  # float32 on CPU: the same arithmetic as transformers


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")


@pytest.mark.forked
def test_qwen3_gguf_head_dim_from_key_length(tiny_qwen3_head_dim_32):
    from vllm import LLM
    from vllm.transformers_utils.hf_config import load_hf_config

    hf_dir, gguf_path = tiny_qwen3_head_dim_32
    assert load_hf_config(gguf_path).head_dim == 32
    ref = hf_greedy(hf_dir, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 6, f"degenerate output {ids}"
    llm = LLM(model=gguf_path, device="cpu", dtype="float32")
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    llm.llm_engine.shutdown()
    check_outputs_equal(
        [(ids, "") for ids, _, _ in ref], [(ids, "") for ids, _, _ in out], "hf-source",
        "qwen3-gguf", PROMPTS,
    )  # fmt: skip
    for p, ((_, _, ref_lps), (_, _, lps)) in enumerate(zip(ref, out)):
        for pos, (a, b) in enumerate(zip(ref_lps, lps)):
            for tok in set(a) & set(b):
                assert abs(a[tok] - b[tok]) <= LOGPROB_TOL, (p, pos, tok)
