"""Mixtral decoder (Jiang et al. 2024): Mistral attention with a sparse MoE in every layer.

Every layer's ``block_sparse_moe`` routes each token to ``num_experts_per_tok`` of
``num_local_experts`` SwiGLU experts (``w1`` gate, ``w3`` up, ``w2`` down), the top-k weights
always renormalised. A ``sliding_window`` caps ``max_model_len`` as for Mistral. Numerics
follow Hugging Face ``MixtralForCausalLM``.
"""

from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.moe_common import MoeWeightsMixin, SparseMoeBlock


class MixtralDecoderLayer(LlamaDecoderLayer):
    """Llama decoder layer whose MLP is a :class:`SparseMoeBlock`."""

    small_batch_gemv = False

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        return SparseMoeBlock(
            config.num_local_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.intermediate_size,
            True,
            config.hidden_act,
        )


class MixtralForCausalLM(MoeWeightsMixin, MistralForCausalLM):
    """Mixtral causal LM for one pipeline stage; same signature and API as Mistral."""

    decoder_layer_cls = MixtralDecoderLayer
    moe_block_name = "block_sparse_moe"
