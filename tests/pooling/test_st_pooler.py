"""A Sentence Transformers checkpoint's own pooler (``modules.json``, its ``Pooling``
config and ``Normalize`` module) is the embedding engine's default, as upstream reads it;
``--override-pooler-config`` keys win over it; a pooling not implemented here is refused
at start-up naming it."""

import gc
import json
import shutil

import pytest
import torch

from tests.pooling.hf_reference import hf_embeddings as _reference

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 100, 12], [1, 300, 41, 17], [1, 64, 65, 66, 67]]


def _st_checkpoint(src, dst, modes: dict, normalize: bool):
    """A copy of ``src`` with Sentence Transformers files: a Pooling module whose config
    turns ``modes`` on, and a Normalize module when ``normalize``."""
    shutil.copytree(src, dst)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})  # fmt: skip
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_lasttoken": False, "include_prompt": True, **modes}  # fmt: skip
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(dst)


def _embed(model, **kw):
    from vllm import LLM

    llm = LLM(model=model, device="cpu", dtype="float32", task="embed", max_model_len=64, **kw)
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    config = llm.llm_engine.config
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return config, [torch.tensor(o.outputs.embedding) for o in outs]


def _check(got, ref, what):
    for i, (g, r) in enumerate(zip(got, ref)):
        assert torch.allclose(g, r, atol=1e-5, rtol=0), f"{what} {i}: {(g - r).abs().max()}"


@pytest.mark.forked
def test_sentence_transformers_mean_pooler_without_normalize(tiny_llama_dir, tmp_path):
    """MEAN pooling and no Normalize module: the engine pools the mean of the prompt's
    hidden states, unnormalized, as the checkpoint declares (not LAST, normalized)."""
    model = _st_checkpoint(tiny_llama_dir, tmp_path / "st",
                           {"pooling_mode_mean_tokens": True}, normalize=False)  # fmt: skip
    config, got = _embed(model)
    pooler = config.pooler_config
    assert (pooler.pooling_type, pooler.normalize) == ("MEAN", False)
    _check(got, _reference(model, PROMPTS, "MEAN", normalize=False), "MEAN raw")
    # MEAN reads every prompt token: prefix caching is off, as with the flag
    assert config.cache_config.enable_prefix_caching is False
    config, got = _embed(model, override_pooler_config='{"normalize": true}')
    pooler = config.pooler_config  # the key given wins, the file's type stays
    assert (pooler.pooling_type, pooler.normalize) == ("MEAN", True)
    _check(got, _reference(model, PROMPTS, "MEAN"), "MEAN normalized by override")


@pytest.mark.forked
def test_sentence_transformers_cls_pooler_with_normalize(tiny_llama_dir, tmp_path):
    model = _st_checkpoint(tiny_llama_dir, tmp_path / "st",
                           {"pooling_mode_cls_token": True}, normalize=True)  # fmt: skip
    config, got = _embed(model)
    assert (config.pooler_config.pooling_type, config.pooler_config.normalize) == ("CLS", True)
    _check(got, _reference(model, PROMPTS, "CLS"), "CLS")


def test_sentence_transformers_pooler_flags(tiny_llama_dir, tmp_path):
    """What the files say only reaches embedding engines; an unimplemented pooling is
    refused unless the override names the pooling type."""
    from vllm.engine.arg_utils import EngineArgs

    def pooler(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config().pooler_config

    last = _st_checkpoint(tiny_llama_dir, tmp_path / "last",
                          {"pooling_mode_lasttoken": True}, normalize=True)  # fmt: skip
    got = pooler(last, task="embed")
    assert (got.pooling_type, got.normalize) == ("LAST", True)
    assert pooler(last) is None  # a generative engine reads no pooler
    maxed = _st_checkpoint(tiny_llama_dir, tmp_path / "max",
                           {"pooling_mode_max_tokens": True}, normalize=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"pooling \(pooling_mode_max_tokens\) is not implemented"):
        pooler(maxed, task="embed")
    got = pooler(maxed, task="embed", override_pooler_config='{"pooling_type": "MEAN"}')
    assert (got.pooling_type, got.normalize) == ("MEAN", True)
