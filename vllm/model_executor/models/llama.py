"""Llama decoder (Touvron et al. 2023) for the engine: fused qkv / gate_up, PP-aware.

Numerics follow Hugging Face ``LlamaForCausalLM`` (float32 RMSNorm, the same rotary
arithmetic); the decoder is written with a fused residual add in each RMSNorm, so the
residual stream travels next to the hidden states (and between pipeline stages as
``IntermediateTensors({"hidden_states", "residual"})``).

Tensor parallelism: the layers split heads (q, and KV heads or their replicas), the MLP's
intermediate size and the vocabulary over the TP ranks
(:mod:`vllm.model_executor.layers.linear`, :mod:`vllm.model_executor.layers.vocab_embedding`);
o_proj and down_proj all-reduce, so every TP rank holds the full hidden states and residual.
"""

import re
from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.distributed.utils import get_pp_indices
from vllm.kernels.dispatch import get_triton_gemv
from vllm.model_executor.layers.activation import get_act_and_mul_fn
from vllm.model_executor.layers.kv_scales import load_attention_scale, log_skipped
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from vllm.model_executor.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.weight_utils import default_weight_loader

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(prefix: str) -> int:
    """The decoder layer index in a module prefix (``model.layers.3.self_attn`` -> 3).

    Raises:
        ValueError: the prefix names no layer.
    """
    match = _LAYER_RE.search(prefix + ".")
    if match is None:
        raise ValueError(f"cannot read the layer index from prefix {prefix!r}")
    return int(match.group(1))


class PPMissingLayer(nn.Identity):
    """Placeholder for a decoder layer owned by another pipeline stage (keeps indices)."""


class LlamaMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = get_act_and_mul_fn(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * intermediate]
        return self.down_proj(self.act_fn(gate_up))  # [T, hidden]


class LlamaAttention(nn.Module):
    """Self-attention: fused qkv projection, RoPE on q/k, paged attention, output projection.

    ``rotary_emb`` None: a layer without positional rotation (SmolLM3's NoPE layers); every
    attention backend then writes and attends to the keys as projected.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        rotary_emb: RotaryEmbedding | None,
        qkv_bias: bool,
        o_bias: bool,
        prefix: str,
    ) -> None:
        super().__init__()
        from vllm.attention import Attention  # lazy: the attention package is optional here

        hidden_size = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // total_heads
        self.scaling = self.softmax_scale(config)
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, total_heads, total_kv_heads, bias=qkv_bias
        )
        # this tensor-parallel rank's heads (all of them at TP = 1)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.qkv_proj.q_size
        self.kv_size = self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden_size, bias=o_bias)
        self.rotary_emb = rotary_emb  # shared by the layers that rotate (or None)
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.scaling,
            num_kv_heads=self.num_kv_heads,
            prefix=f"{prefix}.attn",
            **self.attention_options(config, prefix),
        )

    def attention_options(self, config: PretrainedConfig, prefix: str) -> dict:
        """Further :class:`vllm.attention.Attention` arguments of the layer at ``prefix``
        (``sliding_window``, ``logits_soft_cap``): none for Llama. A family that sets them
        reports them to the backend through
        :func:`vllm.model_executor.models.attention_fields`."""
        return {}

    def softmax_scale(self, config: PretrainedConfig) -> float:
        """The attention softmax scale: ``1 / sqrt(head_dim)``, as HF Llama. A family with
        another scale overrides it, and reports it to the attention backend through
        :func:`vllm.model_executor.models.attention_fields`."""
        return self.head_dim**-0.5

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, kv_cache, attn_metadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)  # [T, q_size + 2 * kv_size]
        return self.o_proj(self.attend(positions, qkv, kv_cache, attn_metadata))  # [T, hidden]

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata):
        """qkv [T, q_size + 2 * kv_size] -> attention output [T, q_size] (before o_proj)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # rotary inside the attention call: the backend may fuse it with its cache write
        return self.attn(q, k, v, kv_cache, attn_metadata, positions, self.rotary_emb)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm decoder layer; the residual add is fused into the following RMSNorm.

    Families that differ only in their attention or MLP subclass this and set
    ``attention_cls`` or override :meth:`make_mlp`; ``small_batch_gemv`` is False for an MLP
    without ``gate_up_proj`` (mixture of experts).
    """

    attention_cls: type[LlamaAttention] = LlamaAttention
    small_batch_gemv = True
    # Granite: the attention and MLP outputs join the residual stream times this; None
    # (every other family): added as they are
    residual_multiplier: float | None = None

    def __init__(
        self, config: PretrainedConfig, rotary_emb: RotaryEmbedding | None, qkv_bias: bool,
        o_bias: bool, mlp_bias: bool, prefix: str,
    ) -> None:  # fmt: skip
        super().__init__()
        self.self_attn = self.attention_cls(
            config, rotary_emb, qkv_bias, o_bias, prefix=f"{prefix}.self_attn"
        )
        self.mlp = self.make_mlp(config, mlp_bias, prefix)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps)

    def make_mlp(self, config: PretrainedConfig, mlp_bias: bool, prefix: str) -> nn.Module:
        """The feed-forward block of layer ``prefix`` (a SwiGLU :class:`LlamaMLP` here)."""
        return LlamaMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act, bias=mlp_bias
        )

    def scale_branch(self, out: torch.Tensor) -> torch.Tensor:
        """An attention or MLP output [T, hidden] as it joins the residual stream: times
        ``residual_multiplier`` when set (a separate multiply, rounded before the add, as
        transformers' Granite), else unchanged."""
        m = self.residual_multiplier
        return out if m is None else out * m

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        kv_cache,
        attn_metadata,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states, residual: [T, hidden] -> (mlp output, residual before it)."""
        gemv = None
        # the fused GEMV path has no all-reduce after o_proj / down_proj (TP = 1 only) and
        # no LoRA term
        attn = self.self_attn
        if self.small_batch_gemv and attn.o_proj.tp_size == 1 and attn.qkv_proj.lora is None:
            # gate_up is the layer's largest projection, o_proj its smallest
            gemv = get_triton_gemv(
                hidden_states, self.mlp.gate_up_proj.weight, self.self_attn.o_proj.weight
            )
        if gemv is not None:
            return self.forward_small_batch(
                gemv, positions, hidden_states, kv_cache, attn_metadata, residual
            )
        qkv, residual = self.pre_attention(hidden_states, residual)
        out = self.self_attn.attend(positions, qkv, kv_cache, attn_metadata)  # [T, q_size]
        return self.post_attention(out, residual)

    def pre_attention(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer up to its attention call: (residual add,) input norm, qkv projection.

        Args:
            hidden_states, residual: [T, hidden]; residual None on the model's first layer.
        Returns:
            (qkv [T, q_size + 2 * kv_size], residual [T, hidden]). Row-wise: row t of the
            result depends on row t of the inputs only (piecewise graphs rely on it).
        """
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        return self.self_attn.qkv_proj(hidden_states), residual

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer after its attention call: o_proj, residual add and norm, MLP.

        Args:
            attn_out: [T, q_size], the attention output before o_proj.
            residual: [T, hidden], from :meth:`pre_attention`.
        Returns:
            (MLP output [T, hidden], residual before it [T, hidden]); row-wise like
            :meth:`pre_attention` (a mixture-of-experts MLP routes each row on its own).
            Both branch outputs pass :meth:`scale_branch`.
        """
        hidden_states = self.scale_branch(self.self_attn.o_proj(attn_out))  # [T, hidden]
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.scale_branch(self.mlp(hidden_states)), residual

    def forward_small_batch(
        self, gemv, positions, hidden_states, kv_cache, attn_metadata, residual
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` for one token, the projections as :mod:`vllm.kernels.gemv` kernels.

        Four projection launches instead of seven: each RMSNorm (and its residual add) runs
        inside the projection after it, and SiLU-and-mul inside gate_up. Same rounding points
        as :meth:`forward` (a ``residual_multiplier`` is its own multiply after o_proj and
        down_proj, as there); ``gemv`` is the module from ``get_triton_gemv``. fp8 weights
        (``--quantization fp8``) pass their row scales to the same kernels.
        """
        attn, mlp = self.self_attn, self.mlp
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        qkv, residual = gemv.norm_linear(
            hidden_states, residual, ln1.weight, ln1.variance_epsilon,
            attn.qkv_proj.weight, attn.qkv_proj.bias, weight_scale=attn.qkv_proj.weight_scale,
        )  # fmt: skip
        out = attn.attend(positions, qkv, kv_cache, attn_metadata)  # [T, q_size]
        o_proj, down_proj = attn.o_proj, mlp.down_proj
        out = gemv.linear(out, o_proj.weight, o_proj.bias, o_proj.weight_scale)  # [T, hidden]
        out = self.scale_branch(out)
        act, residual = gemv.norm_linear(
            out, residual, ln2.weight, ln2.variance_epsilon,
            mlp.gate_up_proj.weight, mlp.gate_up_proj.bias, silu_mul=True,
            weight_scale=mlp.gate_up_proj.weight_scale,
        )  # fmt: skip
        act = gemv.linear(act, down_proj.weight, down_proj.bias, down_proj.weight_scale)
        return self.scale_branch(act), residual  # [T, hidden] each


class LlamaModel(nn.Module):
    """Embedding (first stage), the local decoder layers, final norm (last stage).

    Families with another embedding, final norm or per-layer rotary embeddings override
    :meth:`make_embedding`, :meth:`make_norm` or :meth:`make_rotary_embs`; a family whose
    rotary covers only part of each head overrides :meth:`rotary_dim`.
    """

    def __init__(self, config: PretrainedConfig, pp_rank: int, pp_size: int, qkv_bias: bool,
                 o_bias: bool, mlp_bias: bool,
                 layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer,
                 max_model_len: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.config = config
        self.is_first_rank = pp_rank == 0
        self.is_last_rank = pp_rank == pp_size - 1
        num_layers = config.num_hidden_layers
        self.start_layer, self.end_layer = get_pp_indices(num_layers, pp_rank, pp_size)
        self.embed_tokens = self.make_embedding(config) if self.is_first_rank else None
        # the rotary tables cover every position a sequence can reach; the scaling stays the
        # one of the config's max_position_embeddings (the context the model was trained for)
        num_positions = max(config.max_position_embeddings, max_model_len or 0)
        rotary_embs = self.make_rotary_embs(config, num_positions)
        self.layers = nn.ModuleList(
            layer_cls(config, rotary_embs[i], qkv_bias, o_bias, mlp_bias, f"model.layers.{i}")
            if self.start_layer <= i < self.end_layer
            else PPMissingLayer()
            for i in range(num_layers)
        )
        self.norm = self.make_norm(config) if self.is_last_rank else None

    def make_embedding(self, config: PretrainedConfig) -> nn.Module:
        """The token embedding of the first stage (ids [T] -> [T, hidden])."""
        return VocabParallelEmbedding(config.vocab_size, config.hidden_size)

    def make_norm(self, config: PretrainedConfig) -> nn.Module:
        """The final norm of the last stage."""
        return RMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_rotary_embs(
        self, config: PretrainedConfig, num_positions: int
    ) -> list[RotaryEmbedding | None]:
        """The rotary embedding of each layer index (Llama: one instance shared by all), with
        tables of ``num_positions`` rows; None for a layer without rotary (NoPE)."""
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        rotary_emb = RotaryEmbedding(
            head_dim,
            self.rotary_dim(config, head_dim),
            config.max_position_embeddings,
            get_rope_parameters(config),
            num_positions=num_positions,
        )
        return [rotary_emb] * config.num_hidden_layers

    def rotary_dim(self, config: PretrainedConfig, head_dim: int) -> int:
        """How many channels of each head rotate: all of them. transformers' Llama (and
        the families built on it here, but Phi-3) rotates whole heads whatever
        ``partial_rotary_factor`` says, so the base ignores it too."""
        return head_dim

    def forward(self, input_ids, positions, kv_caches, attn_metadata, intermediate_tensors):
        hidden_states, residual = self._stage_input(input_ids, intermediate_tensors)
        num_local = self.end_layer - self.start_layer
        if len(kv_caches) != num_local:
            raise ValueError(f"got {len(kv_caches)} kv caches for {num_local} local layers")
        for i in range(num_local):
            layer = self.layers[self.start_layer + i]
            hidden_states, residual = layer(
                positions, hidden_states, kv_caches[i], attn_metadata, residual
            )
        return self._stage_output(hidden_states, residual)

    def _stage_input(self, input_ids: torch.Tensor, intermediate_tensors):
        """(hidden states [T, hidden], residual [T, hidden] or None) entering the first
        local layer: the embedding on the first stage, else the received tensors.

        Raises:
            ValueError: a non-first stage without ``intermediate_tensors``.
        """
        if self.is_first_rank:
            return self.embed_tokens(input_ids), None  # [T, hidden]
        if intermediate_tensors is None:
            raise ValueError("a non-first pipeline stage needs intermediate_tensors")
        return intermediate_tensors["hidden_states"], intermediate_tensors["residual"]

    def _stage_output(self, hidden_states: torch.Tensor, residual: torch.Tensor):
        """The stage's output after its last layer: hidden states [T, hidden] after the
        final norm on the last stage, else IntermediateTensors of both."""
        if not self.is_last_rank:
            from vllm.sequence import IntermediateTensors

            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states  # [T, hidden]

    # Piecewise CUDA graphs (vllm/cudagraph/piecewise.py) cut the forward at every attention
    # call: piece 0 runs up to the first local layer's attention, piece i from layer i - 1's
    # attention to layer i's, the last piece from the last attention to the output. The
    # pieces are row-wise, so a graph of N tokens serves any step of at most N tokens.
    def piece_widths(self) -> tuple[int, int]:
        """(qkv width, attention output width) of every local layer, in elements.

        Raises:
            ValueError: local layers with different widths (one buffer serves them all).
        """
        widths = {
            (a.q_size + 2 * a.kv_size, a.q_size)
            for a in (self.layers[i].self_attn for i in range(self.start_layer, self.end_layer))
        }
        if len(widths) != 1:
            raise ValueError(f"piecewise graphs need one qkv width for all layers, got {widths}")
        return widths.pop()

    def piece_first(
        self, input_ids: torch.Tensor, intermediate_tensors
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedding (or the received hidden states) through the first local layer's
        ``pre_attention``: input_ids [T] -> (qkv [T, qkv width], residual [T, hidden])."""
        hidden_states, residual = self._stage_input(input_ids, intermediate_tensors)
        return self.layers[self.start_layer].pre_attention(hidden_states, residual)

    def piece_between(
        self, i: int, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Local layer ``i - 1``'s ``post_attention``, then local layer ``i``'s
        ``pre_attention``: (attn_out [T, attention width], residual [T, hidden]) -> (qkv,
        residual)."""
        layer = self.layers[self.start_layer + i - 1]
        hidden_states, residual = layer.post_attention(attn_out, residual)
        return self.layers[self.start_layer + i].pre_attention(hidden_states, residual)

    def piece_last(self, attn_out: torch.Tensor, residual: torch.Tensor):
        """The last local layer's ``post_attention`` and the stage's output: hidden states
        [T, hidden] after the final norm on the last stage, else IntermediateTensors."""
        layer = self.layers[self.end_layer - 1]
        return self._stage_output(*layer.post_attention(attn_out, residual))

    def piece_attend(
        self, i: int, positions: torch.Tensor, qkv: torch.Tensor, kv_cache, attn_metadata
    ) -> torch.Tensor:
        """Local layer ``i``'s attention call (rotary, KV-cache write, attention), run
        eagerly between pieces: qkv [T, qkv width] -> [T, attention width]."""
        attn = self.layers[self.start_layer + i].self_attn
        return attn.attend(positions, qkv, kv_cache, attn_metadata)


class LlamaForCausalLM(nn.Module):
    """Llama causal LM for one pipeline stage (see module docstring).

    Args:
        config: a transformers ``LlamaConfig``-like config.
        pp_rank, pp_size: this stage and the number of stages; the stage owns layers
            ``[start_layer, end_layer)`` from :func:`get_pp_indices`.
        max_model_len: the longest sequence the engine runs; when it exceeds the config's
            ``max_position_embeddings`` (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``) the rotary tables
            get that many rows, while every RoPE scaling still uses the config's value.
    """

    # checkpoint sub-name -> (fused parameter sub-name, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    packed_shards = {"qkv_proj": {"q", "k", "v"}, "gate_up_proj": {0, 1}}
    # PEFT module names a LoRA adapter may adapt (vllm/lora): the packed names above and
    # the fused ones (a Phi-3 adapter names qkv_proj / gate_up_proj)
    lora_target_modules = (
        "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj",
        "gate_proj", "up_proj", "gate_up_proj", "down_proj",
    )  # fmt: skip
    decoder_layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer
    model_cls: type[LlamaModel] = LlamaModel

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """Refuse what this class does not implement, before anything is built (Llama:
        nothing; a family overrides it).

        Raises:
            ValueError: naming the unsupported setting and its value.
        """

    def __init__(
        self,
        config: PretrainedConfig,
        pp_rank: int = 0,
        pp_size: int = 1,
        max_model_len: int | None = None,
    ) -> None:
        self.check_config(config)
        super().__init__()
        self.config = config
        self.pp_rank, self.pp_size = pp_rank, pp_size
        qkv_bias, o_bias, mlp_bias = self._biases(config)
        self.model = self.model_cls(
            config, pp_rank, pp_size, qkv_bias, o_bias, mlp_bias, self.decoder_layer_cls,
            max_model_len,
        )  # fmt: skip
        self.start_layer, self.end_layer = self.model.start_layer, self.model.end_layer
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None
        if self.model.is_last_rank:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
            if self.tie_word_embeddings and self.model.embed_tokens is not None:
                self.lm_head.tie_weights(self.model.embed_tokens)

    @property
    def piecewise_model(self) -> LlamaModel:
        """The decoder stack, whose ``piece_*`` methods piecewise CUDA graphs capture."""
        return self.model

    @staticmethod
    def _biases(config: PretrainedConfig) -> tuple[bool, bool, bool]:
        """(qkv bias, o_proj bias, mlp bias) from ``attention_bias`` / ``mlp_bias``."""
        attention_bias = bool(getattr(config, "attention_bias", False))
        return attention_bias, attention_bias, bool(getattr(config, "mlp_bias", False))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata,
        intermediate_tensors=None,
    ):
        """input_ids, positions: [T] int64; kv_caches[i] belongs to layer start_layer + i.

        Returns hidden states [T, hidden] after the final norm on the last stage, else
        ``IntermediateTensors({"hidden_states", "residual"})``, each [T, hidden].
        """
        return self.model(input_ids, positions, kv_caches, attn_metadata, intermediate_tensors)

    def compute_logits(
        self, hidden_states: torch.Tensor, float32: bool = True
    ) -> torch.Tensor | None:
        """hidden_states [N, hidden] -> logits [N, vocab_size] float32 (last stage only;
        under tensor parallelism on TP rank 0, None on the other TP ranks). ``float32=False``
        allows the model's dtype (``ParallelLMHead.compute_logits``); a model that
        transforms its logits may still return float32."""
        if self.lm_head is None:
            raise RuntimeError(f"pp_rank={self.pp_rank} is not the last stage: no lm_head")
        return self.lm_head.compute_logits(hidden_states, float32)

    def make_empty_intermediate_tensors(self, num_tokens: int, dtype: torch.dtype, device):
        """Zero ``IntermediateTensors`` [num_tokens, hidden] for a non-first stage's inputs."""
        from vllm.sequence import IntermediateTensors

        shape = (num_tokens, self.config.hidden_size)
        return IntermediateTensors(
            {
                k: torch.zeros(shape, dtype=dtype, device=device)
                for k in ("hidden_states", "residual")
            }
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named checkpoint tensors; return the names of the parameters fully loaded.

        q/k/v go into ``qkv_proj`` and gate/up into ``gate_up_proj`` through the parameter's
        ``weight_loader(param, tensor, shard_id)``; a fused parameter counts as loaded once
        all its shards arrived. Skipped: layers of other stages, ``rotary_emb.inv_freq``,
        modules this stage does not own, ``lm_head.weight`` when embeddings are tied (the
        last stage then fills ``lm_head`` from ``model.embed_tokens.weight``). Attention
        scales (``self_attn.k_scale`` / ``v_scale`` and their other spellings) set the
        KV-cache scales of the layer's attention, or are skipped with one warning
        (vllm/model_executor/layers/kv_scales.py).

        Raises:
            ValueError: a checkpoint name that matches no parameter, a shape mismatch
                (naming the checkpoint tensor), or a KV-cache scale that is not one
                positive value.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        shards_seen: dict[str, set] = {}
        skipped_scales: list[str] = []
        for name, tensor in weights:
            if "rotary_emb." in name:
                continue
            match = _LAYER_RE.search(name)
            if match and not self.start_layer <= int(match.group(1)) < self.end_layer:
                continue
            if load_attention_scale(self, name, tensor, skipped_scales):
                continue
            if name == "lm_head.weight" and (self.tie_word_embeddings or self.lm_head is None):
                continue
            if name == "model.embed_tokens.weight" and self.tie_word_embeddings:
                if "lm_head.weight" in params:  # last stage without its own embedding
                    self.lm_head.weight_loader(params["lm_head.weight"], tensor)
                    loaded.add("lm_head.weight")
            if name.startswith("model.embed_tokens.") and self.model.embed_tokens is None:
                continue
            if name.startswith("model.norm.") and self.model.norm is None:
                continue
            hf_name = name
            name, shard_id = self._packed_name(name)
            param = params.get(name)
            if param is None:
                raise ValueError(
                    f"unexpected checkpoint weight {name!r} for {type(self).__name__} "
                    f"(pp_rank={self.pp_rank}, layers [{self.start_layer}, {self.end_layer}))"
                )
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                if shard_id is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as e:  # a shape or dtype that does not fit: name the tensor
                raise ValueError(f"checkpoint tensor {hf_name!r}: {e}") from e
            if shard_id is None:
                loaded.add(name)
            else:
                shards_seen.setdefault(name, set()).add(shard_id)
        for name, seen in shards_seen.items():
            if seen == self.packed_shards[name.split(".")[-2]]:
                loaded.add(name)
        log_skipped(skipped_scales)
        return loaded

    def _packed_name(self, name: str) -> tuple[str, object]:
        """``model.layers.0.self_attn.k_proj.weight`` -> (``...qkv_proj.weight``, ``"k"``)."""
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in self.packed_modules_mapping:
            fused, shard_id = self.packed_modules_mapping[parts[-2]]
            return ".".join(parts[:-2] + [fused, parts[-1]]), shard_id
        return name, None
