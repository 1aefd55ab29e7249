"""OLMo 2 / 3 pieces without an engine (test_families.py compares both with transformers end
to end, tests/distributed/test_tensor_parallel_cpu.py OLMo 2 at TP = 4):

- the norms round as transformers' ``Olmo2RMSNorm`` (weight multiply in float32, then the
  cast), bit for bit in bfloat16, where Llama's rounding differs; the q/k norm over all
  heads at TP = 1 is the same norm;
- OLMo 3's windows reach the backend's spec; a sliding layer without a window is refused.
"""

import pytest
import torch
from tiny_models import tiny_olmo2_config, tiny_olmo3_config

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models import attention_fields
from vllm.model_executor.models.olmo2 import Olmo3ForCausalLM, OlmoRMSNorm, ShardedRMSNorm


def test_norms_round_as_transformers_in_bf16():
    """OlmoRMSNorm and ShardedRMSNorm (TP = 1) equal transformers' Olmo2RMSNorm bit for
    bit on bf16 inputs and weights; Llama's RMSNorm (cast, then multiply) does not."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=gen).to(torch.bfloat16)  # [T, width]
    weight = (1 + 0.3 * torch.randn(64, generator=gen)).to(torch.bfloat16)
    ref = Olmo2RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    ours = OlmoRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    sharded = ShardedRMSNorm(4, 16, 4, 0, 1, eps=1e-6).to(torch.bfloat16)
    llama = RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        for norm in (ref, ours, sharded, llama):
            norm.weight.copy_(weight)
        expected = ref(x)
        assert torch.equal(ours(x), expected)
        assert torch.equal(sharded(x), expected)
        assert not torch.equal(llama.forward_native(x), expected)


def test_olmo3_windows_and_refusal():
    """OLMo 3's sliding window is in the spec fields (OLMo 2 has none); an OLMo 3 config
    with sliding layers and no window is refused naming it."""
    assert attention_fields(tiny_olmo3_config()) == {"sliding_windows": (8,)}
    assert attention_fields(tiny_olmo2_config()) == {}
    with pytest.raises(ValueError, match="sliding layers need sliding_window >= 1, got None"):
        Olmo3ForCausalLM(tiny_olmo3_config(sliding_window=None, vocab_size=96))
