"""Greedy equality with Hugging Face transformers on the same weights (CPU, float32, exact).

docs/design.md: on CPU in float32 the comparison is exact, batched and one prompt at a time;
random tiny models must produce several distinct tokens per prompt for the comparison to
mean anything.
"""

import pytest

from tests.utils import SMOLLM2_PROMPTS, check_outputs_equal, hf_greedy, vllm_greedy

TINY_PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "Paris"]
MAX_TOKENS = 32


def _engine(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", **kw)


@pytest.mark.forked
def test_smollm2_gguf_matches_transformers(smollm2_gguf):
    ref = hf_greedy(smollm2_gguf, SMOLLM2_PROMPTS, MAX_TOKENS)
    assert ref[0][1].startswith(" Paris."), ref[0][1]
    llm = _engine(smollm2_gguf)
    batched = vllm_greedy(llm, SMOLLM2_PROMPTS, MAX_TOKENS)
    check_outputs_equal(ref, batched, "hf", "vllm-batched", SMOLLM2_PROMPTS)
    alone = [vllm_greedy(llm, [p], MAX_TOKENS)[0] for p in SMOLLM2_PROMPTS[:3]]
    check_outputs_equal(ref[:3], alone, "hf", "vllm-alone", SMOLLM2_PROMPTS[:3])
    tok = llm.get_tokenizer()
    for ids, text, _ in batched:
        assert text == tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


@pytest.mark.forked
@pytest.mark.parametrize(
    "fixture", ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_llama_gguf", "tiny_qwen2_gguf"]
)
def test_tiny_models_match_transformers(fixture, request):
    model = request.getfixturevalue(fixture)
    ref = hf_greedy(model, TINY_PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, f"{fixture} degenerate output {ids}"
    llm = _engine(model)
    check_outputs_equal(ref, vllm_greedy(llm, TINY_PROMPTS, MAX_TOKENS), "hf", fixture)
    alone = [vllm_greedy(llm, [p], MAX_TOKENS)[0] for p in TINY_PROMPTS[:2]]
    check_outputs_equal(ref[:2], alone, "hf", fixture + "-alone")


@pytest.mark.forked
def test_token_id_prompts_equal_text_prompts(smollm2_gguf):
    llm = _engine(smollm2_gguf)
    tok = llm.get_tokenizer()
    prompts = SMOLLM2_PROMPTS[:3]
    by_text = vllm_greedy(llm, prompts, 8)
    by_ids = vllm_greedy(llm, [{"prompt_token_ids": tok.encode(p)} for p in prompts], 8)
    check_outputs_equal(by_text, by_ids, "text", "ids")


@pytest.mark.forked
def test_hf_overrides_rope_scaling_matches_config_json(tiny_llama_dir, tmp_path):
    """``--hf-overrides '{"rope_scaling": ...}'`` gives the tokens transformers gives for a
    config.json holding that rope_scaling next to the model's rope_theta. Guards the
    override dropping rope_theta (transformers 5 assigns rope_scaling over rope_parameters),
    which failed in the rotary embedding with a None base."""
    import json
    import shutil

    scaling = {"rope_type": "linear", "factor": 2.0}
    edited = tmp_path / "linear"
    shutil.copytree(tiny_llama_dir, edited)
    cfg = json.loads((edited / "config.json").read_text())
    theta = cfg.pop("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    cfg.update(rope_scaling=scaling, rope_theta=theta)
    (edited / "config.json").write_text(json.dumps(cfg))
    ref = hf_greedy(str(edited), TINY_PROMPTS, MAX_TOKENS)
    plain = hf_greedy(tiny_llama_dir, TINY_PROMPTS, MAX_TOKENS)
    assert [r[0] for r in ref] != [p[0] for p in plain]  # the scaling changes the outputs
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, f"degenerate output {ids}"
    llm = _engine(tiny_llama_dir, hf_overrides=json.dumps({"rope_scaling": scaling}))
    check_outputs_equal(ref, vllm_greedy(llm, TINY_PROMPTS, MAX_TOKENS), "hf", "hf_overrides")


@pytest.mark.forked
def test_llama31_gguf_rope_freqs_match_the_original_model(tiny_llama31_dir, tiny_llama31_gguf):
    """A GGUF holding llama3 RoPE scaling as llama.cpp writes it (a rope_freqs tensor, no
    rope-scaling keys) gives the tokens of the original HF checkpoint with llama3 scaling.
    Guards the tensor being skipped, which ran the model with unscaled RoPE."""
    ref = hf_greedy(tiny_llama31_dir, TINY_PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, f"degenerate output {ids}"
    llm = _engine(tiny_llama31_gguf)
    rope = llm.llm_engine.model_config.hf_config.rope_parameters
    assert rope["rope_type"] == "default" and len(rope["freq_factors"]) == 8, rope
    out = vllm_greedy(llm, TINY_PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf-llama3", "gguf-rope_freqs", TINY_PROMPTS)
    # Not bit-exact: the blended band's divisor 1 / ((1 - s) / factor + s) is rounded to
    # float32 once, where transformers rounds (1 - s) * f / factor + s * f step by step.
    for (_, _, ref_lps), (_, _, lps) in zip(ref, out):
        for a, b in zip(ref_lps, lps):
            assert max(abs(a[t] - b[t]) for t in set(a) & set(b)) <= 1e-4, (a, b)
