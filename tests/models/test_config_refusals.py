"""Configs a model class does not implement are refused by name before anything is built
(``LlamaForCausalLM.check_config`` and the families' overrides)."""

import pytest
from transformers import Gemma3TextConfig, Phi3Config, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64)  # fmt: skip


@pytest.mark.parametrize(
    "cls, config, words",
    [
        (Qwen2ForCausalLM, Qwen2Config(use_sliding_window=True, **TINY),
         "Qwen2ForCausalLM with use_sliding_window=True"),
        (Qwen3ForCausalLM, Qwen3Config(use_sliding_window=True, head_dim=16, **TINY),
         "Qwen3ForCausalLM with use_sliding_window=True"),
        (Qwen3MoeForCausalLM, Qwen3MoeConfig(use_sliding_window=True, head_dim=16, **TINY),
         "Qwen3MoeForCausalLM with use_sliding_window=True"),
        (Phi3ForCausalLM, Phi3Config(partial_rotary_factor=0.5, **TINY),
         "partial_rotary_factor=0.5"),
        (Gemma3ForCausalLM, Gemma3TextConfig(use_bidirectional_attention=True, head_dim=16,
                                             **TINY),
         "use_bidirectional_attention=True"),
    ],
)  # fmt: skip
def test_unsupported_settings_are_refused(cls, config, words):
    with pytest.raises(ValueError, match=words):
        cls(config)


def test_supported_configs_build():
    """The same classes build with the settings left at their defaults."""
    assert isinstance(Qwen2ForCausalLM(Qwen2Config(**TINY)), LlamaForCausalLM)
    Phi3ForCausalLM(Phi3Config(**TINY))
    Qwen3ForCausalLM(Qwen3Config(head_dim=16, **TINY))
