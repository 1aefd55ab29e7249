"""Linear layers with fused projections and per-parameter weight loaders.

Tensor parallelism is out of scope (docs/design.md "Scope"): every layer holds the full matrix; the
names follow upstream vLLM so that model code reads the same. Each parameter carries a
``weight_loader(param, loaded_weight, shard_id=None)`` attribute that knows where a
checkpoint tensor goes inside it:

- :class:`QKVParallelLinear` stacks q, k and v rows: ``weight`` [(H + 2 * KVH) * D, hidden],
  shard ids ``"q"``, ``"k"``, ``"v"``.
- :class:`MergedColumnParallelLinear` stacks several outputs (gate, up): shard ids 0, 1, ...

Unlike upstream, ``forward`` returns the output tensor only (no ``(output, bias)`` pair).
"""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.weight_utils import default_weight_loader


class LinearBase(nn.Module):
    """``y = x @ weight.T + bias`` with ``weight`` [output_size, input_size] (as nn.Linear)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy a whole checkpoint tensor into ``param`` (shapes must match)."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shards, got shard_id={shard_id!r}")
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # [num_tokens, output_size]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.input_size}, out_features={self.output_size}, "
            f"bias={self.bias is not None}"
        )


class RowParallelLinear(LinearBase):
    """Linear layer split by input columns under TP (here: whole): o_proj, down_proj."""


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel outputs fused into one matmul (gate_proj and up_proj).

    ``weight`` [sum(output_sizes), input_size]; shard ``i`` occupies rows
    ``sum(output_sizes[:i]) : sum(output_sizes[:i + 1])``.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy checkpoint tensor ``loaded_weight`` into rows of shard ``shard_id`` (an int).

        Raises:
            ValueError: unknown shard id or a shape that does not fit the shard.
        """
        if shard_id is None:
            default_weight_loader(param, loaded_weight)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id={shard_id!r} out of range for {len(self.output_sizes)} merged outputs"
            )
        offset = sum(self.output_sizes[:shard_id])
        _copy_rows(param, loaded_weight, offset, self.output_sizes[shard_id], shard_id)


class QKVParallelLinear(LinearBase):
    """Fused query/key/value projection.

    ``weight`` [(num_heads + 2 * num_kv_heads) * head_size, hidden_size]: q rows first, then
    k, then v (the order of ``torch.cat([q, k, v])``). ``forward`` output splits into
    q [T, num_heads * head_size], k and v [T, num_kv_heads * head_size].
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
    ) -> None:
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        q_size = total_num_heads * head_size
        kv_size = total_num_kv_heads * head_size
        super().__init__(hidden_size, q_size + 2 * kv_size, bias)
        self.head_size = head_size
        self.num_heads = total_num_heads
        self.num_kv_heads = total_num_kv_heads
        self.q_size = q_size
        self.kv_size = kv_size

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy q/k/v checkpoint tensor into its rows (``shard_id`` in ``"q"``, ``"k"``, ``"v"``).

        Raises:
            ValueError: unknown shard id or a shape that does not fit the shard.
        """
        if shard_id is None:
            default_weight_loader(param, loaded_weight)
            return
        offsets = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }
        if shard_id not in offsets:
            raise ValueError(f"shard_id={shard_id!r} is not one of ['q', 'k', 'v']")
        offset, size = offsets[shard_id]
        _copy_rows(param, loaded_weight, offset, size, shard_id)


def _copy_rows(
    param: nn.Parameter, loaded: torch.Tensor, offset: int, size: int, shard_id: object
) -> None:
    """Copy ``loaded`` [size, ...] into ``param[offset:offset + size]``, checking the shape."""
    target = param.data.narrow(0, offset, size)
    if tuple(loaded.shape) != tuple(target.shape):
        raise ValueError(
            f"shard {shard_id!r}: checkpoint tensor has shape {tuple(loaded.shape)}, "
            f"the parameter slice expects {tuple(target.shape)}"
        )
    target.copy_(loaded)
