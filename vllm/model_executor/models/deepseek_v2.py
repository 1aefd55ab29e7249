"""DeepSeek-V2 and DeepSeek-V3 decoders (DeepSeek-AI 2024; DeepSeek-V2, V2-Lite, V2.5, V3,
R1, and the V3-architecture Kimi-K2 and Moonlight), ``DeepseekV2ForCausalLM`` and
``DeepseekV3ForCausalLM``.

Llama's pre-norm layer with, following transformers' ``DeepseekV2DecoderLayer`` and
``DeepseekV3DecoderLayer``:

- attention: multi-head latent attention (:mod:`~vllm.model_executor.models.deepseek_mla`:
  latent query / key-value projections, a rotary part shared by the heads, the YaRN
  ``mscale_all_dim`` softmax scale), run as expanded multi-head attention;
- layers ``i < first_k_dense_replace`` have a dense SwiGLU MLP of width
  ``intermediate_size``; the others a mixture of experts::

      y = sum_j w[t, j] * expert_{e[t, j]}(x) + shared_experts(x)

  ``n_routed_experts`` SwiGLU experts of width ``moe_intermediate_size`` plus one always-on
  SwiGLU of width ``moe_intermediate_size * n_shared_experts``, routed:

  - V2 (``DeepseekV2TopkRouter``): softmax scores, ``topk_method`` ``greedy`` or
    ``group_limited_greedy`` (``n_group`` / ``topk_group``), the picked scores times
    ``routed_scaling_factor`` (:func:`~vllm.model_executor.layers.grouped_topk.
    softmax_group_topk`);
  - V3 (``DeepseekV3TopkRouter``, "noaux_tc"): sigmoid scores plus
    ``e_score_correction_bias`` choose within the best ``topk_group`` of ``n_group``
    groups, renormalised when ``norm_topk_prob``, times ``routed_scaling_factor``: GLM-4.5's
    router and block (:class:`~vllm.model_executor.models.glm4_moe.Glm4MoeBlock`), which
    transformers' two routers match line for line.

The routers' weights (and V3's correction bias) are float32 whatever the model dtype, as
transformers keeps them (``_keep_in_fp32_modules_strict``), and replicated under tensor
parallelism; the experts and shared experts are split like Qwen2-MoE's. transformers makes
every layer from ``first_k_dense_replace`` on sparse, ignoring ``moe_layer_freq`` (1 in the
released models; other values are refused). Multi-token-prediction layers
(``model.layers.{num_hidden_layers}.*``, V3) are not run and their tensors are skipped.
Numerics follow Hugging Face ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.layers.grouped_topk import (
    check_expert_groups,
    check_grouped_topk,
    softmax_group_topk,
)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.deepseek_mla import (
    DeepseekMLAttention,
    check_mla_config,
    mla_rotary_emb,
)
from vllm.model_executor.models.glm4_moe import Glm4MoeBlock
from vllm.model_executor.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    layer_index,
)
from vllm.model_executor.models.moe_common import MoeWeightsMixin

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


class DeepseekV2Router(nn.Module):
    """``mlp.gate`` of V2: hidden [T, H] -> (weights [T, top_k] in the hidden dtype, expert
    ids [T, top_k] int64) by :func:`softmax_group_topk` over float32 logits
    ``x @ weight.T``; ``weight`` [E, H] float32, full on every TP rank."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        num_experts, hidden = config.n_routed_experts, config.hidden_size
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32),
                                   requires_grad=False)  # fmt: skip
        self.top_k = config.num_experts_per_tok
        grouped = config.topk_method == "group_limited_greedy"
        self.num_groups = config.n_group if grouped else None
        self.topk_groups = config.topk_group if grouped else None
        self.scaling_factor = float(config.routed_scaling_factor)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = nn.functional.linear(hidden_states.float(), self.weight)  # [T, E] float32
        return softmax_group_topk(logits, self.top_k, self.num_groups, self.topk_groups,
                                  self.scaling_factor, hidden_states.dtype)  # fmt: skip


class DeepseekV2MoeBlock(Glm4MoeBlock):
    """V2's router, routed experts and shared experts: hidden [T, H] -> [T, H] (module
    docstring; GLM-4.5's sum with V2's softmax router)."""

    router_cls = DeepseekV2Router


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    """Pre-norm layer with MLA, whose MLP is dense below ``first_k_dense_replace``, else a
    ``moe_block_cls``."""

    attention_cls = DeepseekMLAttention
    small_batch_gemv = False  # neither the attention nor a MoE block has Llama's projections
    moe_block_cls: type[nn.Module] = DeepseekV2MoeBlock

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        if layer_index(prefix) < (config.first_k_dense_replace or 0):
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                            bias=False)  # fmt: skip
        return self.moe_block_cls(config)

    def pre_attention(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As Llama's (residual add, input norm), then the MLA projections
        (:meth:`DeepseekMLAttention.project`): (qkv [T, q_size + 2 * kv_size], residual
        [T, hidden]); row-wise."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        return self.self_attn.project(hidden_states), residual


class DeepseekV3DecoderLayer(DeepseekV2DecoderLayer):
    """V2's layer with V3's grouped sigmoid router (GLM-4.5's block)."""

    moe_block_cls = Glm4MoeBlock


class DeepseekV2Model(LlamaModel):
    """Llama's decoder stack with MLA's rotary embedding and widths."""

    def interleaved_rope(self, config: PretrainedConfig) -> bool:
        """Whether the rotary channels turn as adjacent pairs: always for V2 (its complex
        rotation, :mod:`~vllm.model_executor.models.deepseek_mla`)."""
        return True

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        rotary_emb = mla_rotary_emb(config, num_positions, self.interleaved_rope(config))
        return [rotary_emb] * config.num_hidden_layers

    def piece_widths(self) -> tuple[int, int]:
        """(qkv width, attention output width) of the local layers: the padded q, k, v
        heads and the unpadded value heads (MLA layers all have the same)."""
        attn = self.layers[self.start_layer].self_attn
        return attn.q_size + 2 * attn.kv_size, attn.out_size


class DeepseekV3Model(DeepseekV2Model):
    """V2's stack; the rotary pairs or halves as ``rope_interleave`` says (default True)."""

    def interleaved_rope(self, config: PretrainedConfig) -> bool:
        return bool(getattr(config, "rope_interleave", True))


def _check_common(config: PretrainedConfig, name: str) -> None:
    """What both versions refuse (see :class:`DeepseekV2ForCausalLM`)."""
    check_mla_config(config, name)
    freq = getattr(config, "moe_layer_freq", None) or 1
    if freq != 1:
        raise ValueError(
            f"{name} with moe_layer_freq={freq} is not supported (transformers makes every "
            "layer from first_k_dense_replace on sparse, as moe_layer_freq=1 does)"
        )
    if getattr(config, "mlp_bias", False):
        raise ValueError(f"{name} with mlp_bias=True is not supported")
    shared = getattr(config, "n_shared_experts", None)
    if not isinstance(shared, int) or shared < 1:
        raise ValueError(f"{name} with n_shared_experts={shared!r} is not supported (at least 1)")


class DeepseekV2ForCausalLM(MoeWeightsMixin, LlamaForCausalLM):
    """DeepSeek-V2 causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: naming the value: a ``scoring_func`` other than ``softmax``, a
            ``topk_method`` outside ``V2_TOPK_METHODS``, a group layout
            ``group_limited_greedy`` cannot route, ``norm_topk_prob`` True (transformers'
            V2 router never renormalises, DeepSeek's own code does: ambiguous), and for
            both versions ``num_key_value_heads`` other than the heads, ``moe_layer_freq``
            other than 1, ``mlp_bias``, fewer than 1 shared expert.
    """

    # q_proj is not a q/k/v shard here; only the dense and shared MLPs fuse gate and up
    packed_modules_mapping = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    packed_shards = {"gate_up_proj": {0, 1}}
    lora_target_modules = ()  # LoRA adapters are not supported for MLA layers
    decoder_layer_cls = DeepseekV2DecoderLayer
    model_cls = DeepseekV2Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        name = cls.__name__
        _check_common(config, name)
        scoring = getattr(config, "scoring_func", None) or "softmax"
        if scoring != "softmax":
            raise ValueError(
                f"{name} with scoring_func={scoring!r} is not supported (transformers' "
                "DeepseekV2TopkRouter scores by 'softmax')"
            )
        method = getattr(config, "topk_method", None) or "greedy"
        if method not in V2_TOPK_METHODS:
            raise ValueError(
                f"{name} with topk_method={method!r} is not supported; supported: "
                f"{list(V2_TOPK_METHODS)}"
            )
        if getattr(config, "norm_topk_prob", False):
            raise ValueError(
                f"{name} with norm_topk_prob=True is not supported (transformers' "
                "DeepseekV2TopkRouter ignores it, DeepSeek's reference code renormalises)"
            )
        if method == "group_limited_greedy":
            check_expert_groups(config.n_routed_experts, config.n_group, config.topk_group)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: naming the value: a ``scoring_func`` other than ``sigmoid``, a
            ``topk_method`` other than ``noaux_tc``, a group layout
            :func:`check_grouped_topk` refuses, and the refusals both versions share
            (:class:`DeepseekV2ForCausalLM`).
    """

    decoder_layer_cls = DeepseekV3DecoderLayer
    model_cls = DeepseekV3Model

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        name = cls.__name__
        _check_common(config, name)
        scoring = getattr(config, "scoring_func", None) or "sigmoid"
        if scoring != "sigmoid":
            raise ValueError(
                f"{name} with scoring_func={scoring!r} is not supported (transformers' "
                "DeepseekV3TopkRouter scores by 'sigmoid')"
            )
        method = getattr(config, "topk_method", None) or "noaux_tc"
        if method != "noaux_tc":
            raise ValueError(
                f"{name} with topk_method={method!r} is not supported (group-limited top-k "
                "with a correction bias, 'noaux_tc')"
            )
        check_grouped_topk(config.n_routed_experts, config.num_experts_per_tok,
                           config.n_group, config.topk_group)  # fmt: skip


__all__ = ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"]
