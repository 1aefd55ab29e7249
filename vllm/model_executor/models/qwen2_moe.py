"""Qwen2-MoE decoder (Qwen team 2024; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention
(q/k/v biases) with mixture-of-experts MLPs that add a gated shared expert.

Where a layer is sparse (the same rule as Qwen3-MoE: ``mlp_only_layers``,
``decoder_sparse_step``) its MLP is ``experts(x) + sigmoid(shared_expert_gate(x)) *
shared_expert(x)``: the routed experts (``num_experts`` of width ``moe_intermediate_size``,
top ``num_experts_per_tok`` of the softmax, renormalised when ``norm_topk_prob``) plus one
always-on SwiGLU expert of width ``shared_expert_intermediate_size`` scaled by a per-token
sigmoid gate. Numerics follow Hugging Face ``Qwen2MoeForCausalLM``.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaMLP
from vllm.model_executor.models.moe_common import MoeWeightsMixin, SparseMoeBlock
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3_moe import is_sparse_layer, qwen_moe_block_args


class SharedExpertMoeBlock(SparseMoeBlock):
    """:class:`SparseMoeBlock` plus a shared expert: hidden [T, H] -> [T, H] (module
    docstring). Under tensor parallelism the shared expert is sharded like a dense MLP
    (its down projection all-reduces) and its gate [1, H] is replicated."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(*qwen_moe_block_args(config))
        self.shared_expert = LlamaMLP(config.hidden_size, config.shared_expert_intermediate_size,
                                      config.hidden_act, bias=False)  # fmt: skip
        self.shared_expert_gate = LinearBase(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shared = self.shared_expert(hidden_states)  # [T, H]
        routed = super().forward(hidden_states)  # [T, H]
        gate = torch.sigmoid(self.shared_expert_gate(hidden_states))  # [T, 1]
        return routed + gate * shared  # [T, H]


class Qwen2MoeDecoderLayer(LlamaDecoderLayer):
    """Qwen2 decoder layer whose MLP is a :class:`SharedExpertMoeBlock` where the config
    says (a dense SwiGLU of width ``intermediate_size`` elsewhere)."""

    small_batch_gemv = False  # the projections of a MoE block are not one gate_up matrix

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, int(prefix.rsplit(".", 1)[1])):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act, False)
        return SharedExpertMoeBlock(config)


class Qwen2MoeForCausalLM(MoeWeightsMixin, Qwen2ForCausalLM):
    """Qwen2-MoE causal LM for one pipeline stage; same signature and API as Qwen2.

    Raises:
        ValueError: as :class:`Qwen2ForCausalLM` (a config that slides some layer).
    """

    decoder_layer_cls = Qwen2MoeDecoderLayer
    # LoRA adapters adapt the attention only (MoeWeightsMixin); the shared expert is not
    # among their targets either


__all__ = ["Qwen2MoeForCausalLM"]
