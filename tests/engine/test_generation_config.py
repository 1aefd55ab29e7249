"""generation_config.json: its end-of-sequence ids stop sequences, its sampling fields are
the defaults of requests that leave them out, and ``--generation-config vllm`` ignores it."""

import json
import os
import shutil

import pytest

from vllm.transformers_utils.generation_config import load_generation_defaults


def _with_generation_config(src: str, dst: str, fields: dict) -> str:
    """A copy of checkpoint ``src`` whose generation_config.json is ``fields``."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "generation_config.json"), "w") as f:
        json.dump(fields, f)
    return dst


def test_defaults_from_the_file(tmp_path, tiny_llama_dir):
    fields = {"eos_token_id": [2, 7, 9], "temperature": 0.6, "top_p": 0.9, "top_k": 20,
              "repetition_penalty": 1.05, "max_new_tokens": 100, "num_beams": 1}  # fmt: skip
    model = _with_generation_config(tiny_llama_dir, str(tmp_path / "m"), fields)
    got = load_generation_defaults(model, "auto")
    assert got.eos_token_ids == [2, 7, 9] and got.source == model
    assert got.sampling == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                            "repetition_penalty": 1.05, "max_tokens": 100}  # fmt: skip
    # a directory given explicitly, and "vllm"
    assert load_generation_defaults(tiny_llama_dir, model).sampling["temperature"] == 0.6
    assert load_generation_defaults(model, "vllm").eos_token_ids == []
    # one eos id as an int; a file that leaves sampling at transformers' defaults
    other = _with_generation_config(tiny_llama_dir, str(tmp_path / "o"), {"eos_token_id": 5})
    got = load_generation_defaults(other, "auto")
    assert got.eos_token_ids == [5] and got.sampling == {}
    with pytest.raises(ValueError, match=r"generation_config='/nowhere' must be 'auto', 'vllm'"):
        load_generation_defaults(model, "/nowhere")


def test_override_generation_config(tmp_path, tiny_llama_dir):
    fields = {"eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9}
    model = _with_generation_config(tiny_llama_dir, str(tmp_path / "m"), fields)
    got = load_generation_defaults(model, "auto", {"temperature": 0.2, "max_new_tokens": 50})
    assert got.sampling == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 50}
    assert got.eos_token_ids == [2, 7] and got.overridden == ["max_tokens", "temperature"]
    assert "--override-generation-config (max_tokens, temperature)" in got.describe_source()
    # without a file ("vllm", or a GGUF / directory without one) only the overrides count
    got = load_generation_defaults(model, "vllm", {"top_k": 5})
    assert (got.sampling, got.eos_token_ids, got.source) == ({"top_k": 5}, [], None)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_tokens'\].*max_new_tokens"):
        load_generation_defaults(model, "auto", {"max_tokens": 5})


def test_override_flags_reach_the_model_config(tiny_llama_dir):
    """--override-generation-config and --hf-overrides as JSON text (the CLI) and as dicts
    (LLM kwargs); bad values are ValueErrors naming the flag, before any weight loads."""
    from vllm.engine.arg_utils import EngineArgs

    def cfg(**kw):
        return EngineArgs(model=tiny_llama_dir, device="cpu", **kw).create_engine_config()

    mc = cfg(
        override_generation_config='{"temperature": 0.3}', hf_overrides='{"rms_norm_eps": 0.01}'
    ).model_config
    assert mc.override_generation_config == {"temperature": 0.3}
    assert mc.hf_config.rms_norm_eps == 0.01
    mc = cfg(hf_overrides={"max_position_embeddings": 64}).model_config
    assert mc.hf_config.max_position_embeddings == 64 and mc.max_model_len == 64
    # rope_theta reaches what the rotary embedding reads (transformers 5's rope_parameters)
    from vllm.model_executor.layers.rotary_embedding import get_rope_parameters

    base = get_rope_parameters(cfg().model_config.hf_config)["rope_theta"]
    mc = cfg(hf_overrides={"rope_theta": 123456.0}).model_config
    assert base != 123456.0 and get_rope_parameters(mc.hf_config)["rope_theta"] == 123456.0
    # rope_scaling replaces the scaling and keeps the model's rope_theta (transformers 5
    # drops the theta when rope_scaling is assigned)
    mc = cfg(hf_overrides='{"rope_scaling": {"type": "linear", "factor": 2.0}}').model_config
    rope = get_rope_parameters(mc.hf_config)
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("linear", 2.0, base)
    with pytest.raises(ValueError, match=r"hf_overrides: num_hidden_layers='x' is refused"):
        cfg(hf_overrides={"num_hidden_layers": "x"})
    with pytest.raises(ValueError, match=r"hf_overrides is not valid JSON: '\{rms'"):
        cfg(hf_overrides="{rms")
    with pytest.raises(ValueError, match=r"override_generation_config must be a JSON object"):
        cfg(override_generation_config="[1]")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['temp'\]"):
        cfg(override_generation_config={"temp": 1})
    with pytest.raises(ValueError, match=r"override_generation_config: temperature must be a "):
        cfg(override_generation_config={"temperature": "hot"})
    with pytest.raises(ValueError, match=r"override_generation_config: top_p must be in"):
        cfg(override_generation_config={"top_p": 5})


@pytest.mark.forked
def test_generation_config_stops_and_defaults(tmp_path, tiny_llama_dir):
    """A token the greedy output reaches becomes a stop token once the generation config
    lists it as an end-of-sequence id: the output ends there (its text dropped, as a stop
    token's), and --generation-config vllm restores the plain output."""
    from vllm import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=12)
    prompt = {"prompt_token_ids": [1, 400, 2000, 31, 77, 5]}
    plain = LLM(tiny_llama_dir, device="cpu", max_model_len=128, generation_config="vllm")
    ref = plain.generate(prompt, greedy, use_tqdm=False)[0].outputs[0]
    ids = list(ref.token_ids)
    assert len(ids) == 12 and ref.finish_reason == "length"
    stop_at = next(i for i in range(3, 12) if ids[i] not in ids[:i])  # its first occurrence
    del plain

    fields = {"eos_token_id": [2, ids[stop_at]], "temperature": 0.7, "max_new_tokens": 9}
    model = _with_generation_config(tiny_llama_dir, str(tmp_path / "m"), fields)
    llm = LLM(model, device="cpu", max_model_len=128)
    out = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == ids[: stop_at + 1]
    assert out.finish_reason == "stop" and out.stop_reason == ids[stop_at]
    assert out.text == llm.get_tokenizer().decode(ids[:stop_at])
    # ignore_eos turns the extra end-of-sequence ids off too
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert list(llm.generate(prompt, p, use_tqdm=False)[0].outputs[0].token_ids) == ids
    # the file's sampling fields are the offline API's defaults
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.max_tokens, d.top_p) == (0.7, 9, 1.0)
    assert len(llm.generate(prompt, use_tqdm=False)[0].outputs[0].token_ids) <= 9
    del llm
    # --override-generation-config replaces the file's fields (greedy: the first 4 ids)
    over = {"max_new_tokens": 4, "temperature": 0}
    llm = LLM(model, device="cpu", max_model_len=128, override_generation_config=over)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.max_tokens) == (0, 4)
    assert list(llm.generate(prompt, use_tqdm=False)[0].outputs[0].token_ids) == ids[:4]


def test_hf_overrides_rope_parameters_keep_model_theta(tiny_qwen2_dir):
    """--hf-overrides '{"rope_parameters": {...yarn...}}' (upstream's documented way to
    turn on YaRN) without a rope_theta keeps the model's theta (1e6 here), as a
    rope_scaling override does; it fell back to 10000, rotating every position wrongly."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.rotary_embedding import get_rope_parameters

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    mc = (
        EngineArgs(model=tiny_qwen2_dir, device="cpu", hf_overrides={"rope_parameters": yarn})
        .create_engine_config()
        .model_config
    )
    rope = get_rope_parameters(mc.hf_config)
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("yarn", 4.0, 1000000.0)
    assert mc.max_model_len == 128
    theta = {**yarn, "rope_theta": 5e5}  # a theta it names wins
    mc = (
        EngineArgs(model=tiny_qwen2_dir, device="cpu", hf_overrides={"rope_parameters": theta})
        .create_engine_config()
        .model_config
    )
    assert get_rope_parameters(mc.hf_config)["rope_theta"] == 5e5
