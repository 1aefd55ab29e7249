"""Checkpoints whose quantization config quantizes only the KV cache, on CPU.

llm-compressor's "KV cache only" FP8 recipes write a compressed-tensors
``quantization_config`` with a ``kv_cache_scheme`` and no ``config_groups`` (or an empty
one): the weights stay in the model's 16-bit dtype and each layer gets a k_scale and a
v_scale. The checkpoint here is the tiny Llama stored in bfloat16 with such a config and
scales that are not 1, loaded in float32 (bfloat16 widens exactly). With ``--kv-cache-dtype
fp8`` the engine equals transformers on the same weights with a cache that stores
``x / scale`` rounded to e4m3 (tests/attention/test_fp8_kv_cache.py's reference); with
``auto`` it equals transformers (docs/design.md: CPU float32, tokens exact, logprobs within
1e-4). The configs the engine refuses are checked without starting it.
"""

import json
import shutil

import pytest
import torch

from tests.attention.test_fp8_kv_cache import (
    MAX_TOKENS,
    PROMPTS,
    _max_logprob_gap,
    _rounded_reference,
)
from tests.attention.test_fp8_kv_scales_engine import KV_SCHEME, _as_loaded
from tests.utils import check_outputs_equal, check_top5_logprobs_within, hf_greedy, vllm_greedy

# (k_scale, v_scale) of the tiny Llama's 3 layers. The engine's float32 keys differ from
# transformers' in the last bits (fused q/k/v, other kernels); a value that close to an e4m3
# rounding midpoint rounds the other way on one side and moves later logprobs by ~1e-2.
# With these scales and weights no value is (as with every fp8 rounding reference here).
SCALES = [(0.05, 3.0), (0.08, 2.5), (0.04, 3.5)]
# llm-compressor's KV-cache-only config: no weight quantization at all
KV_ONLY = {
    "quant_method": "compressed-tensors",
    "format": "dense",
    "config_groups": {},
    "kv_cache_scheme": KV_SCHEME,
    "ignore": [],
    "quantization_status": "compressed",
}


def kv_only_checkpoint(model_dir: str, tmp_path) -> tuple[str, str]:
    """(``model_dir`` in bfloat16 with ``KV_ONLY`` as its quantization_config and the per-layer
    KV-cache scales of ``SCALES``, the same values in float32 without config or scales for
    transformers). Layers 0 and 1 store ``self_attn.k_scale`` / ``v_scale`` (current
    llm-compressor releases), layer 2 the older ``k_proj`` / ``v_proj.output_scale``
    with the zero ``output_zero_point`` tensors those releases wrote (unused)."""
    from tests.models.test_fp8_checkpoint import _set_quantization_config, write_twins

    def convert(key: str, w: torch.Tensor) -> tuple[dict, torch.Tensor]:
        stored = {key: w.to(torch.bfloat16)}
        if key.endswith("self_attn.o_proj.weight"):
            layer = int(key.split(".")[2])
            attn = key[: -len(".o_proj.weight")]
            names = [f"{attn}.k_scale", f"{attn}.v_scale"]
            if layer == 2:
                names = [f"{attn}.k_proj.output_scale", f"{attn}.v_proj.output_scale"]
                for proj in ("k_proj", "v_proj"):
                    stored[f"{attn}.{proj}.output_zero_point"] = torch.zeros(1)
            for name, value in zip(names, SCALES[layer]):
                stored[name] = torch.tensor(value, dtype=torch.float32)  # one value, shape []
        # transformers' twin holds the same values widened to float32: loading it converts
        # nothing (a bf16 -> float32 copy runs in transformers' loader threads, where a
        # forked test process may find torch's OpenMP pool invalid)
        return stored, w.to(torch.bfloat16).float()

    kv_dir, ref_dir = str(tmp_path / "kv-only"), str(tmp_path / "ref")
    write_twins(model_dir, kv_dir, ref_dir, convert)
    _set_quantization_config(kv_dir, KV_ONLY)
    return kv_dir, ref_dir


@pytest.mark.forked
def test_kv_cache_only_checkpoint_equals_transformers(tiny_llama_dir, tmp_path):
    """The weights load unquantized and the layers hold the checkpoint's scales; an fp8
    cache applies them (equal to the scaled rounding reference, which differs measurably
    from the rounding at scale 1), ``auto`` ignores them (equal to transformers)."""
    from vllm import LLM
    from vllm.model_executor.layers.kv_scales import kv_scales_of

    ckpt, ref_dir = kv_only_checkpoint(tiny_llama_dir, tmp_path)
    scales = _as_loaded(SCALES)
    ref = _rounded_reference(ref_dir, torch.float8_e4m3fn, scales)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, ids
    assert _max_logprob_gap(ref, _rounded_reference(ref_dir, torch.float8_e4m3fn)) > 0.05

    llm = LLM(model=ckpt, device="cpu", dtype="float32", kv_cache_dtype="fp8",
              enable_prefix_caching=False)  # fmt: skip
    mc = llm.llm_engine.model_config
    assert (mc.quantization, mc.checkpoint_quantization, mc.checkpoint_dequantized) == (
        None, None, None,
    )  # fmt: skip
    assert llm.apply_model(kv_scales_of) == [scales]
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(ref, out, "hf-scaled", "kv-only-fp8", PROMPTS)
    check_top5_logprobs_within(ref, out, "kv-only-fp8")
    llm.llm_engine.shutdown()
    del llm

    auto = LLM(model=ckpt, device="cpu", dtype="float32", quantization="compressed-tensors",
               enable_prefix_caching=False)  # fmt: skip
    assert auto.apply_model(kv_scales_of) == [scales]  # loaded, and unused
    plain = hf_greedy(ref_dir, PROMPTS, MAX_TOKENS)
    out = vllm_greedy(auto, PROMPTS, MAX_TOKENS, logprobs=5)
    check_outputs_equal(plain, out, "hf", "kv-only-auto", PROMPTS)
    check_top5_logprobs_within(plain, out, "kv-only-auto")
    auto.llm_engine.shutdown()


def _config(model_dir: str, target, qc: dict | None, quant_file: dict | None = None) -> str:
    """A copy of ``model_dir``'s config and tokenizer at ``target`` (no weights: the
    engine config reads none) with ``qc`` as its quantization_config and ``quant_file`` as
    its hf_quant_config.json, when given."""
    from tests.models.test_fp8_checkpoint import _set_quantization_config

    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("*.safetensors"))
    if qc is not None:
        _set_quantization_config(target, qc)
    if quant_file is not None:
        (target / "hf_quant_config.json").write_text(json.dumps(quant_file))
    return str(target)


def test_kv_cache_only_configs(tiny_llama_dir, tmp_path):
    """KV-cache-only compressed-tensors configs (``config_groups`` empty or absent) keep
    the weights unquantized whether ``--quantization`` is unset or names the format;
    ``fp8`` quantizes them on load; another format is a mismatch. Configs with weight
    groups beyond the one supported, a KV-cache scheme other than 8-bit float and
    ModelOpt's KV-cache-only configs (refused upstream too) are refused, naming why."""
    from vllm.engine.arg_utils import EngineArgs

    def build(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config().model_config

    no_groups = {k: v for k, v in KV_ONLY.items() if k != "config_groups"}
    for i, qc in enumerate((KV_ONLY, no_groups)):
        model = _config(tiny_llama_dir, tmp_path / f"kv{i}", qc)
        for quantization in (None, "compressed-tensors"):
            mc = build(model, quantization=quantization)
            assert mc.checkpoint_fp8.kv_cache_only
            assert (mc.quantization, mc.checkpoint_quantization) == (None, None)
        mc = build(model, quantization="fp8")
        assert (mc.quantization, mc.checkpoint_quantization) == ("fp8", None)
        assert build(model, load_format="dummy").quantization is None
        with pytest.raises(ValueError, match="'fbgemm_fp8' does not match .*'compressed-tensors'"):
            build(model, quantization="fbgemm_fp8")

    from tests.models.test_fp8_checkpoint import _compressed_tensors_config

    two = _compressed_tensors_config("channel", static=False)
    two["config_groups"]["group_1"] = two["config_groups"]["group_0"]
    two["kv_cache_scheme"] = KV_SCHEME
    with pytest.raises(ValueError, match=r"'compressed-tensors'.*: 2 config groups \(one is"):
        build(_config(tiny_llama_dir, tmp_path / "two", two))
    int8 = dict(KV_ONLY, kv_cache_scheme=dict(KV_SCHEME, type="int"))
    with pytest.raises(ValueError, match=r"kv_cache_scheme \(type, bits, strategy\) = \('int'"):
        build(_config(tiny_llama_dir, tmp_path / "int8", int8))
    modelopt = {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}
    stored = {"producer": {"name": "modelopt"}, "quantization": {"kv_cache_quant_algo": "FP8"}}
    for name, qc, quant_file in (("mo", modelopt, None), ("mo-file", None, stored)):
        with pytest.raises(ValueError, match="ModelOpt's format is not supported, a KV-cache-"):
            build(_config(tiny_llama_dir, tmp_path / name, qc, quant_file))
