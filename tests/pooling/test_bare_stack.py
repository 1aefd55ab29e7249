"""A checkpoint that holds only the decoder stack under a causal-LM architecture (tensors
``embed_tokens.weight``, ``layers.0...`` without the ``model.`` prefix, no ``lm_head``;
Qwen3-Embedding ships so, its config naming ``Qwen3ForCausalLM``) serves embeddings with
``task="embed"``, equal to transformers' ``AutoModel`` on the same weights, tied or not;
generation from an untied one is refused naming the missing LM head."""

import gc
import json
import shutil

import pytest
import torch

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 100], [1, 300, 41, 17], [1, 64, 65]]


def _bare_qwen3(tiny_models_dir):
    """The tiny Qwen3 saved as ``Qwen3Model`` (no head, no prefix), its config naming
    ``Qwen3ForCausalLM`` (tied embeddings, as the tiny Qwen3 config has them)."""
    from tests.conftest import _built
    from tests.models import tiny_models

    def build(path):
        config = tiny_models.tiny_qwen3_config()
        return tiny_models.save_tiny_decoder_stack(config, path, ["Qwen3ForCausalLM"])

    return _built(tiny_models_dir / "qwen3_bare_stack", build)


def _untied_copy(src, dst):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return str(dst)


@pytest.mark.forked
def test_bare_stack_under_a_causal_lm_architecture(tiny_models_dir, tmp_path):
    from transformers import AutoModel

    from vllm import LLM

    tied = _bare_qwen3(tiny_models_dir)
    untied = _untied_copy(tied, tmp_path / "untied")
    stack = AutoModel.from_pretrained(tied, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = [torch.nn.functional.normalize(stack(torch.tensor([p])).last_hidden_state[0, -1],
                                             dim=0) for p in PROMPTS]  # fmt: skip
    for model in (tied, untied):
        llm = LLM(model=model, device="cpu", dtype="float32", task="embed", max_model_len=64)
        outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
        for i, (o, r) in enumerate(zip(outs, ref)):
            got = torch.tensor(o.outputs.embedding)
            assert torch.allclose(got, r, atol=1e-5, rtol=0), (
                f"{model} {i}: {(got - r).abs().max()}"
            )
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    with pytest.raises(ValueError, match=r"parameters were not found .*: lm_head.weight"):
        LLM(model=untied, device="cpu", dtype="float32", max_model_len=64)
