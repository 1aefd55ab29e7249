"""Embedding engines (``task="embed"``) on CPU float32: ``LLM.embed`` / ``LLM.encode``
equal the pooled hidden states of transformers on the same weights (the model's final
hidden states after its last norm: ``model.model(ids).last_hidden_state``), for LAST, MEAN
and CLS pooling, normalized or not, batched, chunked, prefix-cached and with ``dimensions``
on a Matryoshka config; what an embedding engine cannot do is refused before queueing."""

import gc
import json
import shutil

import pytest
import torch

from tests.pooling.hf_reference import hf_embeddings as _reference

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 100, 12, 14, 77, 31, 64, 65, 66, 67, 68], [1, 300, 41, 17],
           [1, 8], [1, 64, 65, 66, 67, 68, 69, 70, 71, 90]]  # fmt: skip


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", task="embed", **kw)


def _close(llm):
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


def _check(got, ref, what, atol=1e-5):
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        g = torch.as_tensor(g, dtype=torch.float32)
        assert g.shape == r.shape, f"{what} {i}: {g.shape} vs {r.shape}"
        assert torch.allclose(g, r, atol=atol, rtol=0), f"{what} {i}: {(g - r).abs().max()}"


@pytest.mark.forked
@pytest.mark.parametrize("family", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_last_token_embeddings_equal_transformers(family, request):
    model = request.getfixturevalue(family)
    ref = _reference(model, PROMPTS)
    llm = _llm(model, max_model_len=128)
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    _check([o.outputs.embedding for o in outs], ref, family)
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert all(abs(float(torch.tensor(o.outputs.embedding).norm()) - 1) < 1e-5 for o in outs)
    encoded = llm.encode({"prompt_token_ids": PROMPTS[0]}, use_tqdm=False)[0]
    assert encoded.outputs.data.dtype == torch.float32
    _check([encoded.outputs.data], ref[:1], "encode")
    _close(llm)


@pytest.mark.forked
@pytest.mark.parametrize("pooling,normalize", [("MEAN", True), ("CLS", False), ("LAST", False)])
def test_pooler_config_overrides(tiny_llama_dir, pooling, normalize):
    ref = _reference(tiny_llama_dir, PROMPTS, pooling, normalize)
    override = json.dumps({"pooling_type": pooling, "normalize": normalize})
    llm = _llm(tiny_llama_dir, max_model_len=128, override_pooler_config=override)
    # MEAN / CLS read every prompt token: prefix caching is turned off for them
    assert llm.llm_engine.config.cache_config.enable_prefix_caching is (pooling == "LAST")
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    _check([o.outputs.embedding for o in outs], ref, f"{pooling}-{normalize}")
    if not normalize:  # a request's normalize=True overrides the config's False
        from vllm import PoolingParams

        outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS],
                         PoolingParams(normalize=True), use_tqdm=False)  # fmt: skip
        unit = [torch.nn.functional.normalize(r, dim=0) for r in ref]
        _check([o.outputs.embedding for o in outs], unit, f"{pooling}-{normalize}-request-true")
    _close(llm)


@pytest.mark.forked
def test_normalize_per_request_in_one_batch(tiny_llama_dir):
    """PoolingParams.normalize: False returns transformers' raw pooled vector, True and
    None (the config's default, True) the unit one; the four are queued together and
    fit one prefill step, so a step mixes both."""
    from vllm import PoolingParams

    raw = _reference(tiny_llama_dir, PROMPTS, normalize=False)
    unit = _reference(tiny_llama_dir, PROMPTS)
    assert all(abs(float(r.norm()) - 1) > 0.1 for r in raw)  # raw differs from unit
    llm = _llm(tiny_llama_dir, max_model_len=128)
    flags = [False, True, None, False]
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS],
                     [PoolingParams(normalize=f) for f in flags], use_tqdm=False)  # fmt: skip
    want = [r if f is False else u for f, r, u in zip(flags, raw, unit)]
    _check([o.outputs.embedding for o in outs], want, "mixed normalize")
    with pytest.raises(ValueError, match="normalize must be true, false or None"):
        PoolingParams(normalize="no")
    _close(llm)


@pytest.mark.forked
def test_chunked_and_prefix_cached_prompts(tiny_llama_dir):
    """LAST pooling needs the last chunk only, and a prompt whose prefix is cached still
    computes its last token: both equal the plain run."""
    ref = _reference(tiny_llama_dir, PROMPTS)
    llm = _llm(tiny_llama_dir, max_model_len=128, enable_chunked_prefill=True,
               max_num_batched_tokens=6, max_num_seqs=4, block_size=4)  # fmt: skip
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    _check([o.outputs.embedding for o in outs], ref, "chunked")
    again = llm.encode({"prompt_token_ids": PROMPTS[0]}, use_tqdm=False)[0]
    assert again.num_cached_tokens == 16  # 4 full blocks of the 17 tokens
    _check([again.outputs.data], ref[:1], "cached")
    _close(llm)


@pytest.mark.forked
def test_matryoshka_dimensions(tiny_llama_dir, tmp_path):
    from vllm import PoolingParams

    model = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "is_matryoshka": True}))
    (ref,) = _reference(str(model), PROMPTS[:1], normalize=False)
    llm = _llm(str(model), max_model_len=128)
    (out,) = llm.embed({"prompt_token_ids": PROMPTS[0]}, PoolingParams(dimensions=16),
                       use_tqdm=False)  # fmt: skip
    _check([out.outputs.embedding], [torch.nn.functional.normalize(ref[:16], dim=0)], "dim16")
    (out,) = llm.embed({"prompt_token_ids": PROMPTS[0]},
                       PoolingParams(dimensions=16, normalize=False), use_tqdm=False)  # fmt: skip
    _check([out.outputs.embedding], [ref[:16]], "dim16 raw")  # cut, not normalized
    with pytest.raises(ValueError, match="dimensions=65 is above the model's hidden size 64"):
        llm.embed(PROMPTS[0], PoolingParams(dimensions=65))
    _close(llm)


@pytest.mark.forked
def test_matryoshka_dimensions_listed_in_the_config(tiny_llama_dir, tmp_path):
    """A config that lists matryoshka_dimensions serves only those sizes (as upstream):
    a listed one is the normalized prefix, another is refused naming the list."""
    from vllm import PoolingParams

    model = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "matryoshka_dimensions": [16, 32]}))
    (ref,) = _reference(str(model), PROMPTS[:1], normalize=False)
    llm = _llm(str(model), max_model_len=128)
    (out,) = llm.embed({"prompt_token_ids": PROMPTS[0]}, PoolingParams(dimensions=32),
                       use_tqdm=False)  # fmt: skip
    _check([out.outputs.embedding], [torch.nn.functional.normalize(ref[:32], dim=0)], "dim32")
    for dims in (20, 64):
        with pytest.raises(ValueError, match=rf"dimensions={dims}: .* \[16, 32\]"):
            llm.embed(PROMPTS[0], PoolingParams(dimensions=dims))
    _close(llm)


@pytest.mark.forked
def test_what_embedding_engines_refuse(tiny_llama_dir):
    from vllm import LLM, PoolingParams

    llm = _llm(tiny_llama_dir, max_model_len=128)
    with pytest.raises(ValueError, match=r"serves embeddings \(task='embed'\): use LLM.embed"):
        llm.generate(PROMPTS[0])
    with pytest.raises(ValueError, match="does not support Matryoshka representations"):
        llm.embed(PROMPTS[0], PoolingParams(dimensions=8))
    with pytest.raises(ValueError, match=r"longer than max_model_len=128"):
        llm.embed(list(range(1, 200)))
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.embed(PROMPTS[1], use_tqdm=False)[0].outputs.embedding) == 64
    _close(llm)
    gen = LLM(model=tiny_llama_dir, device="cpu", max_model_len=128)
    with pytest.raises(ValueError, match="need an embedding engine: start it with task='embed'"):
        gen.embed(PROMPTS[0])
    _close(gen)


def test_pooler_config_is_the_newer_name(tiny_llama_dir):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=tiny_llama_dir, device="cpu", task="embed",
                        pooler_config='{"pooling_type": "CLS"}').create_engine_config()  # fmt: skip
    assert config.pooler_config.pooling_type == "CLS"


def test_convert_embed_is_task_embed(tiny_llama_dir):
    """Upstream's ``--convert embed`` gives the pooler ``--task embed`` gives; ``auto`` and
    ``none`` leave generation (or what task / runner ask for)."""
    from vllm.engine.arg_utils import EngineArgs

    def pooler(**kw):
        return EngineArgs(model=tiny_llama_dir, device="cpu", **kw).create_engine_config(
        ).pooler_config  # fmt: skip

    want = pooler(task="embed", pooler_config='{"pooling_type": "MEAN"}')
    assert want is not None and want.pooling_type == "MEAN"
    assert pooler(convert="embed", pooler_config='{"pooling_type": "MEAN"}') == want
    assert pooler(convert="embed", runner="pooling") == pooler(task="embed")
    assert pooler(convert="none") is None and pooler(convert="auto") is None
    assert pooler(convert="none", task="embed") == pooler(task="embed")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(task="classify"), r"task='classify' is not supported"),
        (dict(task="generate", runner="pooling"), r"contradict each other"),
        (dict(task="embed", pipeline_parallel_size=2), r"runs at pipeline_parallel_size=1"),
        (
            dict(
                task="embed",
                override_pooler_config='{"pooling_type": "MEAN"}',
                enable_chunked_prefill=True,
            ),
            r"cannot be combined with enable_chunked_prefill",
        ),
        (
            dict(task="embed", override_pooler_config='{"pooling_type": "MAX"}'),
            r"pooling_type='MAX' is not supported",
        ),
        (
            dict(override_pooler_config='{"pooling_type": "MEAN"}'),
            r"override_pooler_config needs task='embed'",
        ),
        (dict(task="embed", override_pooler_config='{"softmax": true}'), r"unknown keys"),
        (
            dict(task="embed", override_pooler_config="{}", pooler_config="{}"),
            r"give override_pooler_config or pooler_config, not both",
        ),
        (dict(convert="classify"), r"convert='classify' is not supported; use one of"),
        (dict(convert="reward"), r"convert='reward' is not supported"),
        (dict(convert="embed", runner="generate"), r"contradict each other"),
    ],
    ids=[
        "classify",
        "contradiction",
        "pp",
        "mean_chunked",
        "max",
        "no_task",
        "unknown_key",
        "both_names",
        "convert_classify",
        "convert_reward",
        "convert_contradiction",
    ],
)
def test_bad_pooling_flags(tiny_llama_dir, kwargs, match):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(ValueError, match=match):
        EngineArgs(model=tiny_llama_dir, device="cpu", **kwargs).create_engine_config()


@pytest.mark.forked
def test_headless_checkpoint_is_an_embedding_model(tiny_models_dir):
    """A decoder stack saved without its LM head (architecture LlamaModel, tensors without
    the ``model.`` prefix, as embedding checkpoints such as e5-mistral ship) is served as
    an embedding model under task auto; generation is refused."""
    from transformers import AutoModel

    from tests.conftest import _built
    from tests.models import tiny_models
    from vllm import LLM

    def build(path):
        return tiny_models.save_tiny_decoder_stack(tiny_models.tiny_llama_config(), path)

    path = _built(tiny_models_dir / "llama_headless", build)
    stack = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    assert type(stack).__name__ == "LlamaModel"
    with torch.no_grad():
        ref = [torch.nn.functional.normalize(stack(torch.tensor([p])).last_hidden_state[0, -1],
                                             dim=0) for p in PROMPTS]  # fmt: skip
    llm = LLM(model=path, device="cpu", dtype="float32", max_model_len=128)
    assert llm.llm_engine.config.pooler_config is not None
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    _check([o.outputs.embedding for o in outs], ref, "headless")
    _close(llm)
    with pytest.raises(ValueError, match="without an LM head .* serves embeddings only"):
        LLM(model=path, device="cpu", task="generate")


@pytest.mark.forked
def test_embed_truncate_prompt_tokens(tiny_llama_dir):
    """LLM.embed / LLM.encode take upstream's truncate_prompt_tokens keyword: each prompt is
    pooled over its last k tokens (-1: the last max_model_len, so a longer prompt fits),
    the keyword wins over the pooling params' own value; a k above max_model_len is refused."""
    from vllm.pooling_params import PoolingParams

    long_prompt = [1] + list(range(200, 349))  # 150 tokens, above max_model_len=128
    ref = _reference(tiny_llama_dir, [PROMPTS[0][-4:], long_prompt[-128:], PROMPTS[1][-2:]])
    llm = _llm(tiny_llama_dir, max_model_len=128)
    outs = llm.embed([{"prompt_token_ids": PROMPTS[0]}], use_tqdm=False, truncate_prompt_tokens=4)
    _check([o.outputs.embedding for o in outs], ref[:1], "k=4")
    outs = llm.encode({"prompt_token_ids": long_prompt}, use_tqdm=False, truncate_prompt_tokens=-1)
    _check([o.outputs.data for o in outs], ref[1:2], "k=-1")
    outs = llm.embed([{"prompt_token_ids": PROMPTS[1]}], [PoolingParams(truncate_prompt_tokens=3)],
                     use_tqdm=False, truncate_prompt_tokens=2)  # fmt: skip
    _check([o.outputs.embedding for o in outs], ref[2:], "keyword over params")
    with pytest.raises(ValueError, match="truncate_prompt_tokens=129 is more than max_model_len"):
        llm.embed({"prompt_token_ids": PROMPTS[0]}, use_tqdm=False, truncate_prompt_tokens=129)
    with pytest.raises(ValueError, match="or -1 for max_model_len"):
        PoolingParams(truncate_prompt_tokens=0)
    # upstream's pooling_task keyword: "embed" is this engine's task, others are refused
    outs = llm.encode({"prompt_token_ids": PROMPTS[0][-4:]}, use_tqdm=False, pooling_task="embed")
    _check([o.outputs.data for o in outs], ref[:1], "pooling_task=embed")
    with pytest.raises(ValueError, match=r"pooling_task='token_embed' is not supported"):
        llm.encode({"prompt_token_ids": PROMPTS[0]}, use_tqdm=False, pooling_task="token_embed")
    _close(llm)


def test_old_task_name_embedding(tiny_llama_dir, caplog):
    """Upstream's older spelling --task embedding starts an embedding engine (warned)."""
    from vllm.engine.arg_utils import EngineArgs

    with caplog.at_level("WARNING", logger="vllm.pooling.config"):
        config = EngineArgs(
            model=tiny_llama_dir, device="cpu", task="embedding"
        ).create_engine_config()
    assert config.pooler_config.pooling_type == "LAST" and config.pooler_config.normalize is True
    assert "upstream's old name of task='embed'" in caplog.text
