"""Tensor-parallel configurations the model or the host cannot run fail in validation,
before any process starts or weight loads, with messages naming the numbers."""

import pytest
from transformers import PretrainedConfig

from vllm.distributed.validation import verify_tensor_parallel, verify_world_fits_devices
from vllm.engine.arg_utils import EngineArgs


@pytest.fixture(autouse=True)
def _no_weight_loading(monkeypatch):
    """Building a model (or starting a worker, which builds one) fails the test."""
    import vllm.model_executor.model_loader as loader

    def boom(*a, **k):
        raise AssertionError("weights were loaded before validation failed")

    monkeypatch.setattr(loader, "get_model", boom)


ENGINE_CASES = [  # the tiny Llama: 4 heads, 2 KV heads, intermediate 128
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be at least 1, got 0"),
    (dict(tensor_parallel_size=3), "num_attention_heads=4 is not divisible by tensor_paral"),
    (
        dict(tensor_parallel_size=2, distributed_executor_backend="uni"),
        "needs the 'mp' or 'ray' executor",
    ),
    (
        dict(tensor_parallel_size=2, pipeline_parallel_size=2, num_scheduler_steps=4),
        "num_scheduler_steps=4 is not supported with tensor_parallel_size=2 and pipeline_par",
    ),
    (
        dict(tensor_parallel_size=2, speculative_model="[ngram]", num_speculative_tokens=2,
             ngram_prompt_lookup_max=2, speculative_draft_tensor_parallel_size=1),
        "speculative_draft_tensor_parallel_size=1 differs from tensor_parallel_size=2",
    ),
    (
        dict(tensor_parallel_size=2, pipeline_parallel_size=2, speculative_model="[ngram]",
             num_speculative_tokens=2, ngram_prompt_lookup_max=2),
        "speculative decoding is not supported with pipeline parallelism",
    ),
]  # fmt: skip


@pytest.mark.parametrize("kwargs,message", ENGINE_CASES, ids=[str(c[0]) for c in ENGINE_CASES])
def test_bad_tp_engine_args(tiny_llama_dir, kwargs, message):
    with pytest.raises(ValueError) as e:
        EngineArgs(model=tiny_llama_dir, device="cpu", **kwargs).create_engine_config()
    assert message in str(e.value)


def test_draft_model_must_split_over_the_ranks(tiny_llama_dir, tmp_path):
    """A draft whose heads do not divide over the target's TP size is refused, naming it."""
    import json
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(tiny_llama_dir, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg.update(num_attention_heads=1, num_key_value_heads=1)
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        EngineArgs(
            model=tiny_llama_dir, device="cpu", tensor_parallel_size=2,
            speculative_model=str(draft), num_speculative_tokens=2,
        ).create_engine_config()  # fmt: skip
    want = f"the draft model {str(draft)!r}: num_attention_heads=1 is not divisible by "
    assert want + "tensor_parallel_size=2" in str(e.value)
    # the same draft at TP = 1, and the target at TP = 2 with n-gram lookups, are accepted
    EngineArgs(
        model=tiny_llama_dir, device="cpu", speculative_model=str(draft), num_speculative_tokens=2
    ).create_engine_config()
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
             "draft_tensor_parallel_size": 2}  # fmt: skip
    cfg = EngineArgs(
        model=tiny_llama_dir, device="cpu", tensor_parallel_size=2, speculative_config=ngram
    ).create_engine_config()
    assert cfg.parallel_config.distributed_executor_backend == "mp"
    assert cfg.speculative_config.is_ngram


def test_tp_engine_config_accepts_layouts(tiny_llama_dir):
    """tp 2 (KV heads split) and tp 4 (each KV head on 2 ranks) with pp 2: world tp x pp."""
    for tp, pp in ((2, 1), (4, 1), (2, 2)):
        cfg = EngineArgs(
            model=tiny_llama_dir, device="cpu", tensor_parallel_size=tp, pipeline_parallel_size=pp
        ).create_engine_config()
        assert cfg.parallel_config.world_size == tp * pp
        assert cfg.parallel_config.distributed_executor_backend == "mp"
        assert cfg.parallel_config.sampling_rank == (pp - 1) * tp
        assert cfg.model_config.get_num_kv_heads(tp) == max(1, 2 // tp)


def _config(heads, kv_heads, intermediate, **extra):
    return PretrainedConfig(
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, **extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    "config,tp,message",
    [
        (_config(6, 6, 128), 4, "num_attention_heads=6 is not divisible by tensor_parallel_size=4"),
        (_config(6, 4, 128), 6, "num_key_value_heads=4 and tensor_parallel_size=6"),
        (_config(4, 2, 130), 4, "intermediate_size=130 is not divisible by tensor_parallel_size=4"),
        (
            _config(4, 2, 128, moe_intermediate_size=34),
            4,
            "moe_intermediate_size=34 is not divisible by tensor_parallel_size=4",
        ),
    ],
)
def test_indivisible_model(config, tp, message):
    with pytest.raises(ValueError) as e:
        verify_tensor_parallel(config, tp)
    assert message in str(e.value)


def test_divisible_models_pass():
    verify_tensor_parallel(_config(4, 1, 128), 4)  # one KV head replicated on 4 ranks
    verify_tensor_parallel(_config(8, 4, 96), 2)  # 2 KV heads per rank
    verify_tensor_parallel(_config(5, 5, 7), 1)  # tp 1: nothing to split


def test_world_larger_than_devices():
    with pytest.raises(ValueError) as e:
        verify_world_fits_devices(2, 2, "cuda", "mp", num_devices=3)
    assert "tensor_parallel_size=2 x pipeline_parallel_size=2 = 4 ranks" in str(e.value)
    assert "only 3 CUDA devices" in str(e.value)
    verify_world_fits_devices(2, 2, "cuda", "mp", num_devices=4)
    verify_world_fits_devices(2, 2, "cuda", "ray", num_devices=1)  # Ray checks its cluster
    verify_world_fits_devices(4, 2, "cpu", "mp", num_devices=0)  # CPU ranks share the host
