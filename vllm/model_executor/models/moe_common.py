"""Decoder pieces shared by the mixture-of-experts families (Qwen3-MoE, Mixtral).

:class:`SparseMoeBlock` is the router (``gate``, a bias-free [E, H] projection) and the
:class:`~vllm.model_executor.layers.fused_moe.FusedMoE` experts; :class:`MoeWeightsMixin`
loads per-expert checkpoint tensors (``...experts.{e}.{gate_proj|up_proj|down_proj|w1|w3|w2}
.weight``) into the stacked expert parameters and hands every other tensor to the Llama
loader.
"""

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.linear import LinearBase

_EXPERT_RE = re.compile(r"^(.*\.layers\.(\d+)\.)(\w+)\.experts\.(\d+)\.(\w+)\.weight$")


class SparseMoeBlock(nn.Module):
    """Router + experts: hidden [T, H] -> [T, H] (see the fused_moe module docstring)."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, hidden_act: str) -> None:  # fmt: skip
        super().__init__()
        self.gate = LinearBase(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(
            num_experts, top_k, hidden_size, intermediate_size, renormalize, hidden_act
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(hidden_states)  # [T, E]
        return self.experts(hidden_states, router_logits)  # [T, H]


class MoeWeightsMixin:
    """``load_weights`` for a LlamaForCausalLM subclass whose layers' ``mlp`` may be a
    :class:`SparseMoeBlock`. ``moe_block_name`` is the checkpoint's name for that block
    (``mlp`` in Qwen3-MoE, ``block_sparse_moe`` in Mixtral); it is renamed to ``mlp``."""

    moe_block_name = "mlp"
    # LoRA adapters (vllm/lora) adapt the attention only: the experts are not linear layers
    lora_target_modules = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Expert tensors go to ``w13_weight`` / ``w2_weight``; the rest as in Llama.

        A stacked parameter counts as loaded once every expert's shards arrived.

        Raises:
            ValueError: an unknown expert projection name, or the Llama loader's errors.
        """
        seen: dict[str, set] = {}
        loaded = super().load_weights(self._split_experts(weights, seen))
        for name, shards in seen.items():
            moe = self.get_submodule(name.rsplit(".", 1)[0])
            per_param = 2 if name.endswith("w13_weight") else 1
            if len(shards) == moe.num_experts * per_param:
                loaded.add(name)
        return loaded

    def _split_experts(self, weights, seen: dict[str, set]) -> Iterator[tuple[str, torch.Tensor]]:
        block = self.moe_block_name
        for name, tensor in weights:
            if block != "mlp":
                name = name.replace(f".{block}.", ".mlp.")
            match = _EXPERT_RE.match(name)
            if match is None:
                yield name, tensor
                continue
            prefix, layer, _, expert, proj = match.groups()
            if not self.start_layer <= int(layer) < self.end_layer:
                continue
            if proj not in FusedMoE.expert_shards:
                raise ValueError(f"unknown expert projection {proj!r} in {name!r}")
            param_name, shard = FusedMoE.expert_shards[proj]
            moe = self.get_submodule(f"{prefix}mlp.experts")
            moe.load_expert(param_name, tensor, int(expert), shard)
            seen.setdefault(f"{prefix}mlp.experts.{param_name}", set()).add((expert, shard))
