"""Validation of the speculative-decoding flags (before any weight is loaded)."""

import json
import os

import pytest

from vllm.engine.arg_utils import EngineArgs


@pytest.fixture(scope="module")
def other_vocab_dir(tiny_llama_dir, tmp_path_factory):
    """A draft *config only* (no weights) with a different vocab size: validation must fail
    on the config alone, so a load would fail differently (missing safetensors)."""
    d = tmp_path_factory.mktemp("vocab_draft")
    cfg = json.load(open(os.path.join(tiny_llama_dir, "config.json")))
    cfg["vocab_size"] = cfg["vocab_size"] + 7
    json.dump(cfg, open(d / "config.json", "w"))
    return str(d)


def _args(model, **kw):
    return EngineArgs(model=model, device="cpu", **kw)


def test_defaults_off(tiny_llama_dir):
    cfg = _args(tiny_llama_dir).create_engine_config()
    assert cfg.speculative_config is None
    assert cfg.scheduler_config.num_lookahead_slots == 0


def test_ngram_config(tiny_llama_dir):
    cfg = _args(
        tiny_llama_dir,
        speculative_model="[ngram]",
        num_speculative_tokens=3,
        ngram_prompt_lookup_max=4,
    ).create_engine_config()
    spec = cfg.speculative_config
    assert spec.is_ngram and spec.num_speculative_tokens == 3
    assert spec.ngram_prompt_lookup_max == 4 and spec.ngram_prompt_lookup_min == 1
    assert cfg.scheduler_config.num_lookahead_slots == 3
    assert spec.speculative_max_model_len == cfg.model_config.max_model_len


def test_draft_config(tiny_llama_dir):
    cfg = _args(
        tiny_llama_dir,
        speculative_model=tiny_llama_dir,
        num_speculative_tokens=4,
        speculative_max_model_len=64,
    ).create_engine_config()
    spec = cfg.speculative_config
    assert spec.draft_model_config.vocab_size == cfg.model_config.vocab_size
    assert spec.draft_model_config.max_model_len == 64 == spec.speculative_max_model_len
    assert cfg.scheduler_config.num_lookahead_slots == 4


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_speculative_tokens=4), "without speculative_model"),
        (dict(speculative_model="[ngram]", ngram_prompt_lookup_max=2), "needs num_speculative"),
        (
            dict(speculative_model="[ngram]", num_speculative_tokens=0, ngram_prompt_lookup_max=2),
            "at least 1, got 0",
        ),
        (dict(speculative_model="[ngram]", num_speculative_tokens=2), "ngram_prompt_lookup_max"),
        (
            dict(
                speculative_model="[ngram]",
                num_speculative_tokens=2,
                ngram_prompt_lookup_max=2,
                ngram_prompt_lookup_min=3,
            ),
            "ngram_prompt_lookup_min",
        ),
        (
            dict(
                speculative_model="[ngram]",
                num_speculative_tokens=2,
                ngram_prompt_lookup_max=2,
                pipeline_parallel_size=2,
            ),
            "not supported with pipeline parallelism",
        ),
        (
            dict(
                speculative_model="[ngram]",
                num_speculative_tokens=2,
                ngram_prompt_lookup_max=2,
                speculative_disable_by_batch_size=1,
            ),
            "speculative_disable_by_batch_size",
        ),
    ],
)
def test_validation_errors(tiny_llama_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        _args(tiny_llama_dir, **kw).create_engine_config()


def test_vocab_mismatch_names_both(tiny_llama_dir, other_vocab_dir):
    with pytest.raises(ValueError) as e:
        _args(
            tiny_llama_dir, speculative_model=other_vocab_dir, num_speculative_tokens=2
        ).create_engine_config()
    msg = str(e.value)
    assert "49159" in msg and "49152" in msg, msg


def test_draft_limit_above_model(tiny_llama_dir):
    with pytest.raises(ValueError, match="speculative_max_model_len"):
        _args(
            tiny_llama_dir,
            speculative_model=tiny_llama_dir,
            num_speculative_tokens=2,
            speculative_max_model_len=10**7,
        ).create_engine_config()


def test_cli_flags():
    import argparse

    p = EngineArgs.add_cli_args(argparse.ArgumentParser())
    a = p.parse_args(
        ["--speculative-model", "[ngram]", "--num-speculative-tokens", "5",
         "--ngram-prompt-lookup-max", "3"]
    )  # fmt: skip
    e = EngineArgs.from_cli_args(a)
    assert (e.speculative_model, e.num_speculative_tokens, e.ngram_prompt_lookup_max) == (
        "[ngram]", 5, 3,
    )  # fmt: skip


def _spec_fields(spec):
    return (spec.speculative_model, spec.num_speculative_tokens, spec.ngram_prompt_lookup_max,
            spec.ngram_prompt_lookup_min, spec.speculative_max_model_len)  # fmt: skip


def test_speculative_config_json_equals_separate_flags(tiny_llama_dir):
    """Upstream's --speculative-config (JSON on the CLI, a dict from Python) builds the
    same SpeculativeConfig as the separate flags, for n-gram lookup and a draft model."""
    import argparse

    p = EngineArgs.add_cli_args(argparse.ArgumentParser())
    js = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}'
    a = p.parse_args(["--speculative-config", js])
    cli = EngineArgs.from_cli_args(a)
    cli.model, cli.device = tiny_llama_dir, "cpu"
    sep = _args(tiny_llama_dir, speculative_model="[ngram]", num_speculative_tokens=5,
                ngram_prompt_lookup_max=3)  # fmt: skip
    got, want = cli.create_engine_config(), sep.create_engine_config()
    assert _spec_fields(got.speculative_config) == _spec_fields(want.speculative_config)
    assert _spec_fields(got.speculative_config)[:3] == ("[ngram]", 5, 3)
    assert got.scheduler_config.num_lookahead_slots == 5
    draft = {"model": tiny_llama_dir, "num_speculative_tokens": 4, "max_model_len": 64}
    got = _args(tiny_llama_dir, speculative_config=draft).create_engine_config()
    want = _args(tiny_llama_dir, speculative_model=tiny_llama_dir, num_speculative_tokens=4,
                 speculative_max_model_len=64).create_engine_config()  # fmt: skip
    assert _spec_fields(got.speculative_config) == _spec_fields(want.speculative_config)
    assert _spec_fields(got.speculative_config)[:2] == (tiny_llama_dir, 4)
    assert got.speculative_config.speculative_max_model_len == 64
    assert cli.speculative_model is None  # the args themselves are not rewritten


@pytest.mark.parametrize(
    "config, kw, match",
    [
        ("{not json", {}, "not valid JSON"),
        ('["ngram"]', {}, "must be a JSON object"),
        ({"method": "eagle", "model": "x"}, {}, r"method 'eagle' is not supported.*ngram"),
        ({"method": "ngram", "num_speculative_tokens": 2, "k": 1}, {}, r"unsupported keys \['k'\]"),
        ({"num_speculative_tokens": 2}, {}, "needs a 'model'"),
        ({"method": "ngram", "model": "x"}, {}, "takes no model"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
            {"num_speculative_tokens": 2},
            "--num-speculative-tokens both set",
        ),
    ],
)
def test_speculative_config_errors(tiny_llama_dir, config, kw, match):
    with pytest.raises(ValueError, match=match):
        _args(tiny_llama_dir, speculative_config=config, **kw).create_engine_config()


@pytest.mark.parametrize(
    "max_num_seqs, ceiling, sizes",
    [
        (8, 512, (1, 2, 4, 8, 16, 24, 32, 40)),
        (3, 512, (1, 2, 4, 8, 15)),
        (1, 512, (1, 2, 4, 5)),
        (8, 16, (1, 2, 4, 8, 16)),
    ],
)
def test_capture_sizes_follow_k(tiny_llama_dir, max_num_seqs, ceiling, sizes):
    """The capture-size rule through the config: the target uses k (B x (k+1) scorer rows),
    the draft worker's config uses k = 0."""
    import torch

    from vllm.spec_decode.spec_decode_worker import draft_engine_config
    from vllm.worker.model_runner import ModelRunner

    cfg = _args(
        tiny_llama_dir,
        max_num_seqs=max_num_seqs,
        max_cudagraph_capture_size=ceiling,
        speculative_model=tiny_llama_dir,
        num_speculative_tokens=4,
    ).create_engine_config()
    target = ModelRunner(cfg, torch.device("cpu")).capture_sizes
    assert target.sizes == sizes
    assert target.scheduler_max_rows == max_num_seqs * 5
    assert list(target.eager_batch_sizes()) == list(range(sizes[-1] + 1, max_num_seqs * 5 + 1))
    draft = ModelRunner(draft_engine_config(cfg), torch.device("cpu")).capture_sizes
    assert draft.scheduler_max_rows == max_num_seqs
    assert draft.sizes[-1] == min(max_num_seqs, ceiling)
