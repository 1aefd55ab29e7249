"""GLM-4.5 decoder (Zhipu AI 2025; GLM-4.5, GLM-4.5-Air, GLM-4.6), ``Glm4MoeForCausalLM``.

Llama's pre-norm layer (two norms, unlike GLM-4-0414's four) with, following transformers'
``Glm4MoeAttention``, ``Glm4MoeMoE`` and ``Glm4MoeTopkRouter``:

- attention: q/k/v biases (``attention_bias``), no o_proj bias; with ``use_qk_norm`` a
  per-head RMSNorm on queries and keys before RoPE (as Qwen3); partial rotary
  (``partial_rotary_factor``, 0.5 in the released models) by halves (NeoX style, not GLM-4's
  interleaved pairs);
- layers ``i < first_k_dense_replace`` have a dense SwiGLU MLP of width
  ``intermediate_size``; the others a mixture of experts::

      y = sum_j w[t, j] * expert_{e[t, j]}(x) + shared_experts(x)

  ``n_routed_experts`` SwiGLU experts of width ``moe_intermediate_size``, routed by the
  sigmoid, bias-corrected, group-limited top-k of
  :mod:`vllm.model_executor.layers.grouped_topk` (``n_group``, ``topk_group``,
  ``norm_topk_prob``, ``routed_scaling_factor``), plus one always-on SwiGLU of width
  ``moe_intermediate_size * n_shared_experts``.

The router (``mlp.gate``: ``weight`` [E, H] and ``e_score_correction_bias`` [E]) is kept in
float32 whatever the model dtype, as transformers keeps it (``_keep_in_fp32_modules_strict``),
and replicated under tensor parallelism; the experts and the shared expert are split like
Qwen2-MoE's. Multi-token-prediction layers (``model.layers.{num_hidden_layers}.*``) are not
run and their tensors are skipped. Numerics follow Hugging Face ``Glm4MoeForCausalLM``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.grouped_topk import check_grouped_topk, grouped_topk
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, partial_rotary_dim
from vllm.model_executor.models.glm4 import glm_head_dim, glm_rotary_emb
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    layer_index,
)
from vllm.model_executor.models.moe_common import MoeWeightsMixin
from vllm.model_executor.models.qwen3 import Qwen3Attention


class Glm4MoeRouter(nn.Module):
    """``mlp.gate``: hidden [T, H] -> (weights [T, top_k] in the hidden dtype, expert ids
    [T, top_k] int64) by :func:`grouped_topk` over float32 logits ``x @ weight.T``.

    ``weight`` [E, H] and ``e_score_correction_bias`` [E] are float32 parameters (the bias a
    parameter, not a buffer, so the checkpoint loader fills it), full on every TP rank.
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        num_experts, hidden = config.n_routed_experts, config.hidden_size
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32),
                                   requires_grad=False)  # fmt: skip
        self.e_score_correction_bias = nn.Parameter(
            torch.empty(num_experts, dtype=torch.float32), requires_grad=False
        )
        self.top_k = config.num_experts_per_tok
        self.num_groups, self.topk_groups = config.n_group, config.topk_group
        self.renormalize = bool(config.norm_topk_prob)
        self.scaling_factor = float(config.routed_scaling_factor)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = nn.functional.linear(hidden_states.float(), self.weight)  # [T, E] float32
        return grouped_topk(
            logits, self.e_score_correction_bias, self.top_k, self.num_groups,
            self.topk_groups, self.renormalize, self.scaling_factor, hidden_states.dtype,
        )  # fmt: skip


class Glm4MoeBlock(nn.Module):
    """Router, routed experts and shared experts: hidden [T, H] -> [T, H] (module
    docstring). ``router_cls`` makes ``mlp.gate``: a module hidden [T, H] -> (weights
    [T, top_k], expert ids [T, top_k]) whose routing the experts take as it is."""

    router_cls: type[nn.Module] = Glm4MoeRouter

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.gate = self.router_cls(config)
        self.experts = FusedMoE(  # (its renormalize flag is unused: the gate routes)
            config.n_routed_experts, config.num_experts_per_tok, config.hidden_size,
            config.moe_intermediate_size, bool(getattr(config, "norm_topk_prob", False)),
            config.hidden_act,
        )  # fmt: skip
        shared_width = config.moe_intermediate_size * config.n_shared_experts
        self.shared_experts = LlamaMLP(config.hidden_size, shared_width, config.hidden_act,
                                       bias=False)  # fmt: skip

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(hidden_states)  # [T, top_k] each
        routed = self.experts.forward_routed(hidden_states, weights, ids)  # [T, H]
        return routed + self.shared_experts(hidden_states)  # [T, H]


class Glm4MoeAttention(Qwen3Attention):
    """Llama attention with Qwen3's per-head q/k norms when ``use_qk_norm`` (else none)."""

    def __init__(self, config: PretrainedConfig, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.use_qk_norm = bool(getattr(config, "use_qk_norm", False))
        if not self.use_qk_norm:
            del self.q_norm, self.k_norm

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata):
        """qkv [T, q_size + 2 * kv_size] -> attention output [T, q_size] (before o_proj)."""
        if self.use_qk_norm:
            return super().attend(positions, qkv, kv_cache, attn_metadata)
        return LlamaAttention.attend(self, positions, qkv, kv_cache, attn_metadata)


class Glm4MoeDecoderLayer(LlamaDecoderLayer):
    """Pre-norm layer whose MLP is dense below ``first_k_dense_replace``, else a
    :class:`Glm4MoeBlock`."""

    attention_cls = Glm4MoeAttention
    small_batch_gemv = False  # the projections of a MoE block are not one gate_up matrix

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        if layer_index(prefix) < config.first_k_dense_replace:
            return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                            bias=False)  # fmt: skip
        return Glm4MoeBlock(config)


class Glm4MoeModel(LlamaModel):
    """Llama's decoder stack with GLM-4.5's partial rotary by halves."""

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        return [glm_rotary_emb(config, num_positions, False)] * config.num_hidden_layers


class Glm4MoeForCausalLM(MoeWeightsMixin, LlamaForCausalLM):
    """GLM-4.5 causal LM for one pipeline stage; same API as LlamaForCausalLM.

    Raises:
        ValueError: naming the value: a ``scoring_func`` other than ``sigmoid`` or a
            ``topk_method`` other than ``noaux_tc`` (keys DeepSeek-style configs may
            carry), ``n_shared_experts`` below 1, a group layout
            :func:`check_grouped_topk` refuses, or a bad ``partial_rotary_factor``.
    """

    decoder_layer_cls = Glm4MoeDecoderLayer
    model_cls = Glm4MoeModel

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """See the class docstring."""
        name = cls.__name__
        scoring = getattr(config, "scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(
                f"{name} with scoring_func={scoring!r} is not supported (transformers' "
                "Glm4MoeTopkRouter scores by 'sigmoid')"
            )
        method = getattr(config, "topk_method", "noaux_tc")
        if method != "noaux_tc":
            raise ValueError(
                f"{name} with topk_method={method!r} is not supported (group-limited top-k "
                "with a correction bias, 'noaux_tc')"
            )
        if config.n_shared_experts < 1:
            raise ValueError(
                f"{name} with n_shared_experts={config.n_shared_experts} is not supported "
                "(at least 1)"
            )
        check_grouped_topk(config.n_routed_experts, config.num_experts_per_tok,
                           config.n_group, config.topk_group)  # fmt: skip
        partial_rotary_dim(config, glm_head_dim(config))

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """``attention_bias`` on q/k/v only (no o_proj bias), no MLP bias."""
        return bool(getattr(config, "attention_bias", False)), False, False


__all__ = ["Glm4MoeForCausalLM"]
