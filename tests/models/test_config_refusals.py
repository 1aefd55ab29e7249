"""Configs a model class does not implement are refused by name before anything is built
(``LlamaForCausalLM.check_config`` and the families' overrides)."""

import pytest
from transformers import (
    Gemma3TextConfig,
    GraniteConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    SmolLM3Config,
)

from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.granite import GraniteForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from vllm.model_executor.models.smollm3 import SmolLM3ForCausalLM

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64)  # fmt: skip


@pytest.mark.parametrize(
    "cls, config, words",
    [
        (Qwen2ForCausalLM, Qwen2Config(use_sliding_window=True, max_window_layers=0, **TINY),
         "Qwen2ForCausalLM with use_sliding_window=True"),
        (Qwen3ForCausalLM, Qwen3Config(use_sliding_window=True, max_window_layers=0,
                                       head_dim=16, **TINY),
         "Qwen3ForCausalLM with use_sliding_window=True"),
        (Qwen3MoeForCausalLM, Qwen3MoeConfig(use_sliding_window=True, head_dim=16, **TINY),
         "Qwen3MoeForCausalLM with use_sliding_window=True"),
        (Phi3ForCausalLM, Phi3Config(partial_rotary_factor=1.5, **TINY),
         r"partial_rotary_factor=1.5 must be in \(0, 1\]"),
        (Phi3ForCausalLM, Phi3Config(partial_rotary_factor=0.3125, **TINY),
         r"partial_rotary_factor=0.3125 gives rotary_dim = int\(16 \* 0.3125\) = 5"),
        (Gemma3ForCausalLM, Gemma3TextConfig(use_bidirectional_attention=True, head_dim=16,
                                             **TINY),
         "use_bidirectional_attention=True"),
        (GraniteForCausalLM, GraniteConfig(logits_scaling=0.0, **TINY), "logits_scaling=0"),
        # transformers slides the NoPE layers (here layer 0) under use_sliding_window
        (SmolLM3ForCausalLM, SmolLM3Config(use_sliding_window=True, sliding_window=8,
                                           no_rope_layer_interval=1, **TINY),
         r"SmolLM3ForCausalLM with layer_types \['sliding_attention'\] .*sliding_window=8"),
        (SmolLM3ForCausalLM, SmolLM3Config(no_rope_layers=[2], **TINY),
         r"no_rope_layers must hold 0 \(NoPE\) or 1 \(RoPE\) .* got \[2\]"),
    ],
)  # fmt: skip
def test_unsupported_settings_are_refused(cls, config, words):
    with pytest.raises(ValueError, match=words):
        cls(config)


def test_supported_configs_build():
    """The same classes build with the settings left at their defaults, and Qwen2 / Qwen3
    with ``use_sliding_window`` whose ``max_window_layers`` leaves no layer sliding (their
    ``layer_types`` are all full attention in transformers; they used to be refused), and
    Phi-3 with a partial rotary (8 of the 16 channels of each head; it used to be refused),
    and SmolLM3 likewise when no NoPE layer would slide."""
    assert isinstance(Qwen2ForCausalLM(Qwen2Config(**TINY)), LlamaForCausalLM)
    Phi3ForCausalLM(Phi3Config(**TINY))
    rotary = Phi3ForCausalLM(Phi3Config(partial_rotary_factor=0.5, **TINY)).model.layers[0]
    assert rotary.self_attn.rotary_emb.rotary_dim == 8
    Qwen3ForCausalLM(Qwen3Config(head_dim=16, **TINY))
    window = dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    qwen2, qwen3 = Qwen2Config(**window, **TINY), Qwen3Config(**window, head_dim=16, **TINY)
    assert qwen2.layer_types == qwen3.layer_types == ["full_attention"]
    Qwen2ForCausalLM(qwen2)
    Qwen3ForCausalLM(qwen3)
    GraniteForCausalLM(GraniteConfig(**TINY))
    # a window whose layers all apply RoPE: transformers slides none of them
    smollm3 = SmolLM3Config(use_sliding_window=True, sliding_window=8, **TINY)
    assert smollm3.layer_types == ["full_attention"] and smollm3.no_rope_layers == [1]
    SmolLM3ForCausalLM(smollm3)


@pytest.mark.parametrize(
    "config, words",
    [
        (Qwen2Config(use_sliding_window=True, max_window_layers=0,
                     architectures=["Qwen2ForCausalLM"], **TINY),
         "Qwen2ForCausalLM with use_sliding_window=True"),
        (Qwen2Config(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
                     architectures=["Qwen2ForCausalLM"], **TINY),
         "rope_type='dynamic' is not supported"),
        (Gemma3TextConfig(head_dim=16, architectures=["Gemma3ForCausalLM"],
                          rope_parameters={
                              "full_attention": {"rope_type": "dynamic", "rope_theta": 1e6,
                                                 "factor": 8.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                          }, **TINY),
         "rope_type='dynamic' is not supported"),
    ],
)  # fmt: skip
def test_engine_config_refuses_before_any_model_is_built(tiny_qwen2_dir, config, words):
    """The engine's config validation asks the model class and the rotary embedding, so
    ``LLM(...)`` / ``vllm serve`` refuse such a config before a worker starts (they used
    to fail only when the worker built the model)."""
    from vllm.config import ModelConfig

    with pytest.raises(ValueError, match=words):
        ModelConfig(model=tiny_qwen2_dir, hf_config=config)


@pytest.mark.parametrize("model_type", ["nemotron", "falcon", "starcoder2"])
def test_gguf_of_an_unregistered_architecture_names_the_gguf_ones(tmp_path, model_type):
    """A GGUF file whose architecture the engine does not have at all (transformers
    converts nemotron, falcon, starcoder2 GGUF metadata to configs without
    ``architectures``) is refused with the architectures that load from GGUF. Guards the
    message listing every registered architecture (Mistral, Phi-3, ... included), which a
    GGUF file of those is then refused for too."""
    from transformers import AutoConfig

    from vllm.config import ModelConfig

    gguf = tmp_path / f"{model_type}.gguf"
    gguf.write_bytes(b"")  # the config is given: the file is only recognised by its name
    config = AutoConfig.for_model(model_type)
    config.architectures = [f"<{model_type}>"]  # as load_hf_config names a GGUF's class
    with pytest.raises(ValueError) as err:
        ModelConfig(model=str(gguf), hf_config=config)
    gguf_archs = (
        "['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', 'Gemma2ForCausalLM', "
        "'Gemma3ForCausalLM']"
    )
    assert str(err.value).startswith(f"<{model_type}> is not supported from a GGUF file")
    assert f"GGUF files load for {gguf_archs}" in str(err.value)
    assert "MistralForCausalLM" not in str(err.value)
