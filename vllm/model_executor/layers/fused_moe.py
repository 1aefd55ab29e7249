"""Mixture-of-experts feed-forward block: top-k routing and the experts, stored once.

Shared by the MoE families. Each token's router logits ``x @ gate.T`` go through a
float32 softmax; the ``top_k`` largest probabilities pick the experts and, renormalised to
sum to 1 when the config asks (``norm_topk_prob`` for Qwen3-MoE, always for Mixtral), weight
their outputs (GLM-4.5 routes with its own function and hands the weights and ids to
:meth:`FusedMoE.forward_routed`)::

    y[t] = sum_j  w[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t])),  e = expert[t, j]

The expert weights are two stacked parameters, ``w13_weight`` [E, 2 * I, H] (gate rows, then
up rows) and ``w2_weight`` [E, H, I], loaded from per-expert checkpoint tensors. Under tensor
parallelism every rank holds every expert with its intermediate dimension split: ``I / tp``
gate and up rows and ``I / tp`` down columns of each expert; the output is all-reduced.
:meth:`FusedMoE.forward_native` is the plain torch path (CPU, and the reference): one
matmul per expert over the tokens routed to it, accumulated in increasing expert order with
``index_add_`` exactly as transformers does, so float32 results are bit-identical to it.
It reads the chosen experts back to the host (``torch.unique``), so it cannot be captured in
a CUDA graph. On CUDA the experts run as Triton grouped GEMMs over tokens sorted by expert
(:mod:`vllm.kernels.fused_moe`, chosen by ``vllm.kernels.dispatch.get_triton_moe``; no host
synchronisation, graph-capturable at every batch size). Where that path is off
(``VLLM_USE_TRITON_OPS=0``, no triton), :meth:`FusedMoE.forward_dense` runs every expert
over every token with the weight of an unchosen expert set to 0 (adding ``+-0.0`` changes no
sum, so the result is the same): also capturable, at E / top_k times the expert FLOPs.
"""

import torch
from torch import nn

from vllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.distributed.tp_ops import tensor_model_parallel_all_reduce
from vllm.kernels.dispatch import get_triton_moe
from vllm.model_executor.layers.activation import get_act_and_mul_fn
from vllm.model_executor.weight_utils import narrow_weight, weight_shape


def route_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, top_k] in ``dtype``, expert ids [T, top_k] int64).

    Softmax in float32, ``torch.topk`` (ties to the lower index, as transformers), then
    ``weights / weights.sum(-1)`` when ``renormalize``.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)  # [T, top_k] each
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype), ids


class FusedMoE(nn.Module):
    """The experts of one MoE layer (see module docstring).

    Args:
        num_experts: E, the number of experts (more than ``top_k``).
        top_k: experts per token.
        hidden_size: H.
        intermediate_size: I, each expert's feed-forward width (split over TP ranks).
        renormalize: renormalise the top-k weights to sum to 1.
        hidden_act: the gated activation (``silu``).

    Raises:
        ValueError: ``top_k`` not in [1, num_experts]; I not divisible by the TP size.
    """

    # checkpoint projection name -> (stacked parameter, shard): Qwen3-MoE and Mixtral names
    expert_shards = {
        "gate_proj": ("w13_weight", 0),
        "up_proj": ("w13_weight", 1),
        "down_proj": ("w2_weight", None),
        "w1": ("w13_weight", 0),
        "w3": ("w13_weight", 1),
        "w2": ("w2_weight", None),
    }

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, hidden_act: str = "silu") -> None:  # fmt: skip
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
        if hidden_act != "silu":  # the Triton expert kernel computes SiLU-and-mul
            raise ValueError(f"hidden_act={hidden_act!r} is not supported for experts: 'silu' only")
        self.num_experts, self.top_k = num_experts, top_k
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        if intermediate_size % self.tp_size:
            raise ValueError(
                f"moe intermediate_size={intermediate_size} is not divisible by "
                f"tensor_parallel_size={self.tp_size}."
            )
        intermediate_size //= self.tp_size  # this rank's
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act_fn = get_act_and_mul_fn(hidden_act)

    def load_expert(self, param_name: str, tensor: torch.Tensor, expert: int, shard) -> None:
        """Copy one expert's checkpoint tensor into ``w13_weight`` (``shard`` 0 gate, 1 up) or
        ``w2_weight`` (``shard`` None).

        Raises:
            ValueError: expert out of range or a shape that does not fit.
        """
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} out of range [0, {self.num_experts})")
        dest = getattr(self, param_name).data[expert]  # [2I, H] or [H, I] (this rank's I)
        size = self.intermediate_size
        if shard is not None:
            dest = dest[shard * size : (shard + 1) * size]
        if self.tp_size > 1:  # this rank's gate/up rows or down columns
            dim = 0 if shard is not None else 1
            if weight_shape(tensor)[dim] != size * self.tp_size:
                raise ValueError(
                    f"expert {expert} {param_name} shard {shard}: checkpoint shape "
                    f"{weight_shape(tensor)}, expected dim {dim} = {size * self.tp_size}"
                )
            tensor = narrow_weight(tensor, dim, self.tp_rank * size, size)
        if tuple(dest.shape) != weight_shape(tensor):
            raise ValueError(
                f"expert {expert} {param_name} shard {shard}: checkpoint shape "
                f"{weight_shape(tensor)}, expected {tuple(dest.shape)}"
            )
        dest.copy_(narrow_weight(tensor, 0, 0, dest.shape[0]))

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H], router_logits [T, E] -> [T, H] (see module docstring);
        all-reduced over the TP ranks (each computes its slice of every expert)."""
        weights, ids = self.route(router_logits, hidden_states.dtype)  # [T, top_k] each
        return self.forward_routed(hidden_states, weights, ids)

    def route(
        self, router_logits: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] -> (weights [T, top_k] in ``dtype``, expert ids [T, top_k]
        int64): the softmax top-k of :func:`route_topk`."""
        return route_topk(router_logits, self.top_k, self.renormalize, dtype)

    def forward_routed(
        self, hidden_states: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """The experts for a routing made elsewhere (GLM-4.5's grouped sigmoid router,
        :mod:`vllm.model_executor.layers.grouped_topk`): hidden_states [T, H], weights
        [T, top_k] in the hidden dtype, ids [T, top_k] int64 -> [T, H], all-reduced over the
        TP ranks."""
        out = self._experts(hidden_states, weights, ids)  # [T, H], this rank's partial sum
        return tensor_model_parallel_all_reduce(out)

    def _experts(
        self, hidden_states: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """This rank's experts' output [T, H] (native / Triton / dense)."""
        if not hidden_states.is_cuda:
            return self.experts_native(hidden_states, weights, ids)
        kernels = get_triton_moe(hidden_states)
        if kernels is None:
            return self.experts_dense(hidden_states, weights, ids)
        return kernels.fused_experts(
            hidden_states.contiguous(), self.w13_weight, self.w2_weight, weights, ids
        )

    def forward_dense(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`experts_dense` after the softmax top-k routing (this rank's sum)."""
        return self.experts_dense(hidden_states, *self.route(router_logits, hidden_states.dtype))

    def experts_dense(
        self, hidden_states: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """Every expert over every token, unchosen ones weighted 0; no host synchronisation."""
        experts = torch.arange(self.num_experts, device=ids.device)  # [E]
        chosen = ids[:, :, None] == experts  # [T, top_k, E]
        dense = (weights[:, :, None] * chosen).sum(dim=1)  # [T, E]: one non-zero term each
        out = torch.zeros_like(hidden_states)  # [T, H]
        for expert in range(self.num_experts):
            act = self.act_fn(torch.nn.functional.linear(hidden_states, self.w13_weight[expert]))
            y = torch.nn.functional.linear(act, self.w2_weight[expert])  # [T, H]
            out += y * dense[:, expert, None]
        return out

    def forward_native(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`experts_native` after the softmax top-k routing (this rank's sum)."""
        return self.experts_native(hidden_states, *self.route(router_logits, hidden_states.dtype))

    def experts_native(
        self, hidden_states: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """The plain torch path: per expert, its tokens' SwiGLU, weighted and index-added."""
        out = torch.zeros_like(hidden_states)  # [T, H]
        for expert in torch.unique(ids).tolist():  # sorted: increasing expert order
            token_idx, slot = torch.where(ids == expert)  # [n] each, token order
            x = hidden_states[token_idx]  # [n, H]
            act = self.act_fn(torch.nn.functional.linear(x, self.w13_weight[expert]))  # [n, I]
            y = torch.nn.functional.linear(act, self.w2_weight[expert])  # [n, H]
            out.index_add_(0, token_idx, y * weights[token_idx, slot, None])
        return out

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, top_k={self.top_k}, "
            f"intermediate_size={self.intermediate_size}, renormalize={self.renormalize}"
        )
