"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2") for the DeepSeek-V2 /
V3 decoders, run as ordinary multi-head attention over expanded keys and values.

Following transformers' ``DeepseekV2Attention`` and ``DeepseekV3Attention``, per token ``x``
[hidden] and head ``h`` (``nope`` = ``qk_nope_head_dim``, ``rope`` = ``qk_rope_head_dim``,
``v`` = ``v_head_dim``, ``r`` = ``kv_lora_rank``)::

    q = q_proj(x)  or, with q_lora_rank set,  q_b_proj(q_a_layernorm(q_a_proj(x)))
    q_nope[h], q_pe[h] = split(q[h], [nope, rope])
    c, k_pe = split(kv_a_proj_with_mqa(x), [r, rope])      # k_pe: one rotary key for all heads
    k_nope[h], v[h] = split(kv_b_proj(kv_a_layernorm(c))[h], [nope, v])
    score[h] = (q_nope[h] . k_nope[h] + rope(q_pe[h]) . rope(k_pe)) * softmax_scale
    out = o_proj(concat_h(softmax(score[h]) @ v[h]))

The two latent norms are RMSNorms with eps 1e-6 whatever ``rms_norm_eps`` says (transformers
builds them with its default). The softmax scale is ``(nope + rope) ** -0.5``, times
``mscale ** 2`` when the RoPE scaling sets ``mscale_all_dim`` (transformers'
``yarn_apply_mscale``, :func:`mla_softmax_scale`).

RoPE: DeepSeek-V2 (complex multiplication over ``view_as_complex`` pairs) and DeepSeek-V3
with ``rope_interleave`` (``apply_rotary_pos_emb_interleave``) both rotate adjacent pairs
``(x[2i], x[2i + 1])`` by angle ``i``; V3 lays the result out as evens then odds, V2 keeps
the pairs in place. A permutation applied to both queries and keys leaves every dot product
unchanged, so both run as the interleaved
:class:`~vllm.model_executor.layers.rotary_embedding.RotaryEmbedding`; V3 without
``rope_interleave`` rotates halves (``rotate_half``).

Expanded attention: the paged cache holds full per-head keys and values rather than the
latent ``c`` and ``k_pe`` (simple, exact; it costs ``2 * heads * head_size`` cache entries
per token instead of ``r + rope``). The engine's cache and backends take one head size for
queries, keys and values, so each head is laid out as ``head_size = max(nope + rope, v)``
channels::

    query [rope(q_pe) | q_nope | 0...],  key [rope(k_pe) | k_nope | 0...],  value [v | 0...]

The rotary channels come first so the attention call rotates them as any partial rotary
(the first ``rope`` channels); zero channels of q and k add nothing to a score, and the
zero channels of V give zero output channels, which are sliced off before ``o_proj``. The
scale is passed explicitly (not ``head_size ** -0.5``) and reported to the backends by
:func:`vllm.model_executor.models.attention_fields`.

Tensor parallelism: the heads are split (``q_proj`` / ``q_b_proj`` and ``kv_b_proj``
column-parallel, ``o_proj`` row-parallel); ``q_a_proj``, ``kv_a_proj_with_mqa`` and the two
latent norms are replicated, as every head reads the same latents.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from vllm.model_executor.layers.yarn_rope import yarn_factor, yarn_mscale

LATENT_NORM_EPS = 1e-6  # transformers' DeepseekV2RMSNorm / DeepseekV3RMSNorm default


def qk_head_dim(config: PretrainedConfig) -> int:
    """``qk_nope_head_dim + qk_rope_head_dim``: the channels of a query or key head."""
    return config.qk_nope_head_dim + config.qk_rope_head_dim


def mla_head_size(config: PretrainedConfig) -> int:
    """The head size of the attention layers and the KV cache: the larger of the query /
    key head and the value head (module docstring: the other is zero-padded)."""
    return max(qk_head_dim(config), config.v_head_dim)


def mla_softmax_scale(config: PretrainedConfig) -> float:
    """``qk_head_dim ** -0.5``, times ``yarn_mscale(factor, mscale_all_dim)`` twice when the
    RoPE type is not ``default`` and ``mscale_all_dim`` is set, as transformers'
    ``yarn_apply_mscale`` (same float operations, so the same float)."""
    scale = qk_head_dim(config) ** -0.5
    params = get_rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim")
    if params["rope_type"] != "default" and mscale_all_dim:
        mscale = yarn_mscale(yarn_factor(params, config.max_position_embeddings), mscale_all_dim)
        scale = scale * mscale * mscale
    return scale


def mla_rotary_emb(
    config: PretrainedConfig, num_positions: int, interleaved: bool
) -> RotaryEmbedding:
    """The rotary embedding of every layer: the first ``qk_rope_head_dim`` channels of each
    ``mla_head_size``-wide head, as adjacent pairs (``interleaved``: V2, and V3 with
    ``rope_interleave``) or halves (module docstring); tables of ``num_positions`` rows."""
    return RotaryEmbedding(
        mla_head_size(config),
        config.qk_rope_head_dim,
        config.max_position_embeddings,
        get_rope_parameters(config),
        num_positions=num_positions,
        interleaved=interleaved,
    )


def check_mla_config(config: PretrainedConfig, name: str) -> None:
    """Refuse an MLA layout the attention does not run.

    Raises:
        ValueError: ``num_key_value_heads`` other than ``num_attention_heads`` (the latent
            expands to one key and value per query head), or a non-positive head dimension
            or latent rank; the message names the value.
    """
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if kv_heads != heads:
        raise ValueError(
            f"{name} with num_key_value_heads={kv_heads} is not supported: multi-head latent "
            f"attention expands one key and value per query head (num_attention_heads={heads})"
        )
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"):
        value = getattr(config, key)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} with {key}={value!r} is not supported (a positive int)")
    q_lora_rank = getattr(config, "q_lora_rank", None)
    if q_lora_rank is not None and (not isinstance(q_lora_rank, int) or q_lora_rank < 1):
        raise ValueError(f"{name} with q_lora_rank={q_lora_rank!r} is not supported")


class DeepseekMLAttention(nn.Module):
    """MLA as expanded multi-head attention (module docstring); the interface of
    :class:`~vllm.model_executor.models.llama.LlamaAttention`: :meth:`project` (the
    row-wise part before the attention call), :meth:`attend`, ``o_proj``.

    Args:
        config: a DeepSeek-V2 / V3 config.
        rotary_emb: :func:`mla_rotary_emb` of the config.
        qkv_bias, o_bias: ``attention_bias``: biases of ``q_a_proj`` and
            ``kv_a_proj_with_mqa``, and of ``o_proj`` (transformers gives ``q_proj``,
            ``q_b_proj`` and ``kv_b_proj`` none).
        prefix: the module's name.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        rotary_emb: RotaryEmbedding,
        qkv_bias: bool,
        o_bias: bool,
        prefix: str,
    ) -> None:
        super().__init__()
        from vllm.attention import Attention  # lazy: the attention package is optional here

        hidden, total_heads = config.hidden_size, config.num_attention_heads
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = config.v_head_dim, config.kv_lora_rank
        self.qk_dim = qk_head_dim(config)
        self.head_size = mla_head_size(config)
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * self.qk_dim)
        else:
            self.q_a_proj = LinearBase(hidden, self.q_lora_rank, bias=qkv_bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, total_heads * self.qk_dim)
        self.kv_a_proj_with_mqa = LinearBase(hidden, self.kv_lora_rank + self.rope_dim,
                                             bias=qkv_bias)  # fmt: skip
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, total_heads * (self.nope_dim + self.v_head_dim)
        )
        self.o_proj = RowParallelLinear(total_heads * self.v_head_dim, hidden, bias=o_bias)
        self.num_heads = self.kv_b_proj.output_size // (self.nope_dim + self.v_head_dim)
        # this rank's widths: query, key and value of the attention call (padded heads)
        self.q_size = self.kv_size = self.num_heads * self.head_size
        self.out_size = self.num_heads * self.v_head_dim  # o_proj's input
        self.scaling = mla_softmax_scale(config)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_size, self.scaling,
                              num_kv_heads=self.num_heads, prefix=f"{prefix}.attn")  # fmt: skip

    def project(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, hidden] -> qkv [T, q_size + 2 * kv_size]: the padded query,
        key and value heads, laid out as the module docstring says (not yet rotated).
        Row-wise."""
        t, h, rope, qk = hidden_states.shape[0], self.num_heads, self.rope_dim, self.qk_dim
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)  # [T, h * qk]
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))  # [T, h * qk]
        q_nope, q_pe = q.view(t, h, qk).split([self.nope_dim, rope], dim=-1)
        latent = self.kv_a_proj_with_mqa(hidden_states)  # [T, kv_lora_rank + rope]
        compressed, k_pe = latent.split([self.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(compressed))  # [T, h * (nope + v)]
        k_nope, v = kv.view(t, h, -1).split([self.nope_dim, self.v_head_dim], dim=-1)
        qkv = hidden_states.new_zeros(t, 3, h, self.head_size)  # [T, q / k / v, h, head_size]
        qkv[:, 0, :, :rope] = q_pe
        qkv[:, 0, :, rope:qk] = q_nope
        qkv[:, 1, :, :rope] = k_pe.unsqueeze(1)  # one rotary key, broadcast over the heads
        qkv[:, 1, :, rope:qk] = k_nope
        qkv[:, 2, :, : self.v_head_dim] = v
        return qkv.view(t, -1)  # [T, 3 * h * head_size]

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata):
        """qkv [T, q_size + 2 * kv_size] -> attention output [T, out_size] (before o_proj):
        rotary on the first ``qk_rope_head_dim`` channels of q and k, paged attention with
        the MLA softmax scale, the value heads' padding dropped."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = self.attn(q, k, v, kv_cache, attn_metadata, positions, self.rotary_emb)
        out = out.view(-1, self.num_heads, self.head_size)[..., : self.v_head_dim]
        return out.reshape(-1, self.out_size)  # [T, h * v_head_dim]

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, kv_cache, attn_metadata
    ) -> torch.Tensor:
        qkv = self.project(hidden_states)  # [T, q_size + 2 * kv_size]
        return self.o_proj(self.attend(positions, qkv, kv_cache, attn_metadata))  # [T, hidden]


__all__ = [
    "DeepseekMLAttention",
    "check_mla_config",
    "mla_head_size",
    "mla_rotary_emb",
    "mla_softmax_scale",
]
