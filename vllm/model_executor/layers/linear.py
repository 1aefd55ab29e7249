"""Linear layers with fused projections, tensor-parallel sharding and per-parameter loaders.

Names and semantics follow upstream vLLM. With ``tp`` tensor-parallel ranks
(:func:`~vllm.distributed.parallel_state.get_tensor_model_parallel_world_size`; 1 without a
group, where every layer holds the full matrix and computes exactly as ``nn.Linear``):

- :class:`ColumnParallelLinear` splits the output rows: rank ``r`` holds rows
  ``[r * out / tp, (r + 1) * out / tp)`` and returns its slice of the output (no gather: the
  next layer is row-parallel or per-head).
- :class:`MergedColumnParallelLinear` (gate, up) splits each fused output alike: rank ``r``
  holds ``[gate_r; up_r]``, shard ids 0, 1, ...
- :class:`QKVParallelLinear` splits heads: ``num_heads / tp`` query heads per rank; KV heads
  ``num_kv_heads / tp`` per rank when ``tp <= num_kv_heads``, else each KV head replicated on
  ``tp / num_kv_heads`` consecutive ranks (one per rank). Shard ids ``"q"``, ``"k"``, ``"v"``.
- :class:`RowParallelLinear` splits the input columns: each rank multiplies its slice of the
  input by its columns, the partial sums are all-reduced, then the bias is added once.

Each parameter carries ``weight_loader(param, loaded_weight, shard_id=None)`` that narrows a
checkpoint tensor (or a lazy safetensors slice, so a rank reads only its rows or columns) to
this rank's shard. ``forward`` returns the output tensor only (no ``(output, bias)`` pair).

With LoRA adapters (vllm/lora) a layer carries ``lora``, its adapter slots, called on the
layer's input and output; :meth:`LinearBase.output_slices` tells the slots where each fused
output lies.

With ``--quantization fp8`` a quantizable layer's weight is float8_e4m3fn with per-row
scales in ``weight_scale`` (vllm/model_executor/layers/fp8.py); :meth:`LinearBase.matmul`
runs either kind.
"""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.distributed.tp_ops import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.fp8 import fp8_linear
from vllm.model_executor.weight_utils import default_weight_loader, narrow_weight, weight_shape


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator // denominator``, raising when it does not divide.

    Raises:
        ValueError: naming ``what`` and both numbers.
    """
    if numerator % denominator:
        raise ValueError(
            f"{what}={numerator} is not divisible by tensor_parallel_size={denominator}."
        )
    return numerator // denominator


class LinearBase(nn.Module):
    """``y = x @ weight.T + bias`` with ``weight`` [output_size, input_size], replicated on
    every TP rank (e.g. a MoE router).

    ``quantizable``: whether ``--quantization fp8`` quantizes the weight (the subclasses,
    the decoder's projections; not a replicated router). ``input_is_parallel``: the input
    columns are split over TP ranks (:class:`RowParallelLinear`).
    """

    quantizable = False
    input_is_parallel = False

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.input_size = input_size  # this rank's
        self.output_size = output_size  # this rank's
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        # LoRA slots (vllm.lora.layers.LoRALinear): lora(x, y) adds the adapters' terms
        self.lora = None
        # [output_size] float32 row scales once the weight is fp8 (fp8.quantize_model)
        self.register_buffer("weight_scale", None, persistent=False)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` [T, input_size] @ ``weight.T`` (+ ``bias``) -> [T, output_size]; an fp8
        weight through :func:`~vllm.model_executor.layers.fp8.fp8_linear`."""
        if self.weight_scale is None:
            return F.linear(x, self.weight, bias)
        return fp8_linear(x, self.weight, self.weight_scale, bias)

    def output_slices(self) -> dict[object, tuple[int, int]]:
        """Shard id -> (first output row, rows) of each fused output of this rank, in
        order; one entry with shard id None for an unfused layer."""
        return {None: (0, self.output_size)}

    def lora_shard(
        self, shard_id: object, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of a LoRA adapter's A [r, in] and B [out, r] of shard
        ``shard_id`` (None: the whole output), cut as the layer's weight is cut.

        B's rows are the rows of the same output as the weight's, so the layer's own
        ``weight_loader`` cuts them (into a [output_size, r] buffer laid out as the
        weight); shard ``shard_id``'s rows of it are returned (all of them for None). A is
        whole: the input is not split (see :meth:`RowParallelLinear.lora_shard`)."""
        rows = b.new_zeros(self.output_size, b.shape[1])  # [output_size, r]
        self.weight_loader(rows, b, shard_id)
        offset, size = (0, self.output_size) if shard_id is None else self.output_slices()[shard_id]
        return a, rows[offset : offset + size]

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy a whole checkpoint tensor into ``param`` (shapes must match)."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shards, got shard_id={shard_id!r}")
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias)  # [num_tokens, output_size]
        return y if self.lora is None else self.lora(x, y)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.input_size}, out_features={self.output_size}, "
            f"bias={self.bias is not None}, tp_size={self.tp_size}"
        )


class ColumnParallelLinear(LinearBase):
    """Output rows split over TP ranks: ``weight`` [output_size / tp, input_size].

    Raises:
        ValueError: ``output_size`` not divisible by tp.
    """

    quantizable = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        super().__init__(input_size, divide(output_size, tp, "output_size"), bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's rows of the checkpoint tensor [output_size, ...] into ``param``."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shards, got shard_id={shard_id!r}")
        size = param.shape[0]
        default_weight_loader(param, narrow_weight(loaded_weight, 0, self.tp_rank * size, size))


class RowParallelLinear(LinearBase):
    """Input columns split over TP ranks (o_proj, down_proj): ``weight`` [output_size,
    input_size / tp], bias [output_size] whole; partial products all-reduced, bias added
    after the reduction (once).

    Raises:
        ValueError: ``input_size`` not divisible by tp.
    """

    quantizable = True
    input_is_parallel = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        super().__init__(divide(input_size, tp, "input_size"), output_size, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Weight: this rank's columns of [output_size, input_size]; bias: whole."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shards, got shard_id={shard_id!r}")
        if param is self.weight:
            size = param.shape[1]
            loaded_weight = narrow_weight(loaded_weight, 1, self.tp_rank * size, size)
        default_weight_loader(param, loaded_weight)

    def lora_shard(self, shard_id, a, b):
        """A's columns of this rank, B whole: each rank adds B (A_r x_r) before the
        all-reduce, whose sum is B A x (see :meth:`LinearBase.lora_shard`)."""
        return a.narrow(1, self.tp_rank * self.input_size, self.input_size), b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            y = self.matmul(x, self.bias)  # [num_tokens, output_size]
            return y if self.lora is None else self.lora(x, y)
        y = self.matmul(x, None)  # [T, output_size], this rank's partial sums
        if self.lora is not None:  # linear in x_r: the all-reduce sums the ranks' terms
            y = self.lora(x, y)
        y = tensor_model_parallel_all_reduce(y)
        return y if self.bias is None else y + self.bias


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel outputs fused into one matmul (gate_proj and up_proj).

    ``weight`` [sum(output_sizes) / tp, input_size]; shard ``i`` occupies rows
    ``sum(output_sizes[:i]) / tp`` onwards, ``output_sizes[i] / tp`` of them.

    Raises:
        ValueError: an output size not divisible by tp.
    """

    quantizable = True

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.output_sizes = [divide(s, tp, "output_size") for s in output_sizes]  # this rank's
        super().__init__(input_size, sum(self.output_sizes), bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's rows of checkpoint shard ``shard_id`` (an int) into ``param``;
        ``shard_id=None`` takes an already fused tensor (all shards stacked, e.g. Phi-3).

        Raises:
            ValueError: unknown shard id or a shape that does not fit the shard.
        """
        if shard_id is None:
            total = [s * self.tp_size for s in self.output_sizes]
            for i, size in enumerate(self.output_sizes):
                start = sum(total[:i]) + self.tp_rank * size
                self.weight_loader(param, narrow_weight(loaded_weight, 0, start, size), i)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id={shard_id!r} out of range for {len(self.output_sizes)} merged outputs"
            )
        size = self.output_sizes[shard_id]
        if weight_shape(loaded_weight)[0] == size * self.tp_size and self.tp_size > 1:
            loaded_weight = narrow_weight(loaded_weight, 0, self.tp_rank * size, size)
        offset = sum(self.output_sizes[:shard_id])
        _copy_rows(param, loaded_weight, offset, size, shard_id)

    def output_slices(self) -> dict[object, tuple[int, int]]:
        """Shard i -> (first row, rows) of merged output i on this rank."""
        return {i: (sum(self.output_sizes[:i]), n) for i, n in enumerate(self.output_sizes)}


class QKVParallelLinear(LinearBase):
    """Fused query/key/value projection, split by heads (see module docstring).

    ``weight`` [(num_heads + 2 * num_kv_heads) * head_size, hidden_size] with this rank's
    ``num_heads`` / ``num_kv_heads``: q rows first, then k, then v. ``forward`` output splits
    into q [T, num_heads * head_size], k and v [T, num_kv_heads * head_size].

    Raises:
        ValueError: heads not divisible by tp; tp and KV heads where neither divides the
            other.
    """

    quantizable = True

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
    ) -> None:
        tp = get_tensor_model_parallel_world_size()
        rank = get_tensor_model_parallel_rank()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if tp >= total_num_kv_heads:
            divide(tp, total_num_kv_heads, "num_key_value_heads' replicas: tp")
            self.num_kv_heads = 1
            self.kv_head_start = rank // (tp // total_num_kv_heads)  # replicated KV head
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "num_key_value_heads")
            self.kv_head_start = rank * self.num_kv_heads
        self.head_size = head_size
        self.q_size = self.num_heads * head_size  # this rank's
        self.kv_size = self.num_kv_heads * head_size  # this rank's
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's heads of a q/k/v checkpoint tensor into their rows (``shard_id``
        in ``"q"``, ``"k"``, ``"v"``); ``shard_id=None`` takes the fused [q; k; v] tensor.

        Raises:
            ValueError: unknown shard id or a shape that does not fit the shard.
        """
        d = self.head_size
        total_q, total_kv = self.total_num_heads * d, self.total_num_kv_heads * d
        src = {  # shard -> (first checkpoint row of this rank, in the full q / k / v tensor)
            "q": self.tp_rank * self.q_size,
            "k": self.kv_head_start * d,
            "v": self.kv_head_start * d,
        }
        if shard_id is None:
            fused_start = {"q": 0, "k": total_q, "v": total_q + total_kv}
            for sid in ("q", "k", "v"):
                size = self.q_size if sid == "q" else self.kv_size
                part = narrow_weight(loaded_weight, 0, fused_start[sid] + src[sid], size)
                _copy_rows(param, part, self._dest(sid), size, sid)
            return
        if shard_id not in src:
            raise ValueError(f"shard_id={shard_id!r} is not one of ['q', 'k', 'v']")
        size = self.q_size if shard_id == "q" else self.kv_size
        full = total_q if shard_id == "q" else total_kv
        if self.tp_size > 1 and weight_shape(loaded_weight)[0] == full:
            loaded_weight = narrow_weight(loaded_weight, 0, src[shard_id], size)
        _copy_rows(param, loaded_weight, self._dest(shard_id), size, shard_id)

    def output_slices(self) -> dict[object, tuple[int, int]]:
        """ "q", "k", "v" -> (first row, rows) of this rank's heads of each."""
        return {sid: (self._dest(sid), self.q_size if sid == "q" else self.kv_size)
                for sid in ("q", "k", "v")}  # fmt: skip

    def _dest(self, shard_id: str) -> int:
        """First row of shard ``shard_id`` in this rank's fused parameter."""
        return {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard_id]


def _copy_rows(param: nn.Parameter, loaded, offset: int, size: int, shard_id: object) -> None:
    """Copy ``loaded`` [size, ...] into ``param[offset:offset + size]``, checking the shape."""
    target = param.data.narrow(0, offset, size)
    if weight_shape(loaded) != tuple(target.shape):
        raise ValueError(
            f"shard {shard_id!r}: checkpoint tensor has shape {weight_shape(loaded)}, "
            f"the parameter slice expects {tuple(target.shape)}"
        )
    target.copy_(narrow_weight(loaded, 0, 0, size))
