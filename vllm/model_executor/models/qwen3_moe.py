"""Qwen3-MoE decoder (Qwen team 2025): Qwen3 attention with mixture-of-experts MLPs.

Layer i has a sparse MoE block (``num_experts`` experts of width ``moe_intermediate_size``,
``num_experts_per_tok`` per token, renormalised when ``norm_topk_prob``) unless it is listed
in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step != 0``, where it has a dense
SwiGLU MLP of width ``intermediate_size``. Numerics follow Hugging Face
``Qwen3MoeForCausalLM``.
"""

from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.models.llama import LlamaMLP
from vllm.model_executor.models.moe_common import MoeWeightsMixin, SparseMoeBlock
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM


def is_sparse_layer(config: PretrainedConfig, layer: int) -> bool:
    """Whether Qwen3-MoE layer ``layer`` has experts (see module docstring)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    return layer not in only_mlp and config.num_experts > 0 and (layer + 1) % step == 0


def qwen_moe_block_args(config: PretrainedConfig) -> tuple:
    """:class:`SparseMoeBlock`'s arguments from a Qwen2-MoE / Qwen3-MoE config: experts,
    top-k, hidden size, expert width, renormalise (``norm_topk_prob``), activation."""
    return (
        config.num_experts,
        config.num_experts_per_tok,
        config.hidden_size,
        config.moe_intermediate_size,
        bool(getattr(config, "norm_topk_prob", False)),
        config.hidden_act,
    )


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    """Qwen3 decoder layer whose MLP is a :class:`SparseMoeBlock` where the config says."""

    small_batch_gemv = False  # the projections of a MoE block are not one gate_up matrix

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, int(prefix.rsplit(".", 1)[1])):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act, False)
        return SparseMoeBlock(*qwen_moe_block_args(config))


class Qwen3MoeForCausalLM(MoeWeightsMixin, Qwen3ForCausalLM):
    """Qwen3-MoE causal LM for one pipeline stage; same signature and API as Qwen3."""

    decoder_layer_cls = Qwen3MoeDecoderLayer
