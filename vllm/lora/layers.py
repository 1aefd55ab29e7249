"""The LoRA slots of one linear layer and the batched product over them.

Every adapted linear layer holds, per virtual engine (VE), ``max_loras`` slots of
``S`` slices of rank ``R = max_lora_rank`` each (``S``: the layer's fused outputs, 3 for
qkv_proj, 2 for gate_up_proj, 1 otherwise), laid out as columns::

    a[ve]  [L * S * R, in]    rows (l * S + s) * R ..: slot l, slice s: A (r rows used)
    b[ve]  [out, L * S * R]   the same columns: B * scale in slice s's output rows

so one token's LoRA term is ``b @ (mask * (a @ x))`` where ``mask`` keeps the columns of
the token's slot (a token without an adapter has slot -1: no column). That is two GEMMs
and a compare for the whole batch, whatever mix of adapters it holds, with static shapes:
a CUDA graph captures it once per size and replays it for any mix, reading the token slots
from the VE's static buffer (:class:`LoRAContext`). Unused rank rows and other slices'
rows are zero, so ranks below ``R`` and adapters of a few modules cost nothing extra in
correctness (only the fixed GEMM width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.forward_context import current_virtual_engine


class LoRAContext:
    """Per VE, the adapter slot of every token of the step being prepared or run.

    Args:
        num_ves: virtual engines.
        max_tokens: tokens of the largest forward pass (padded graph sizes included).
        device: where the model runs.

    ``token_slots[ve]`` [max_tokens] int32: slot of token t of VE ``ve``'s current step, -1
    for none (and for padded lanes).
    """

    def __init__(self, num_ves: int, max_tokens: int, device: torch.device):
        self.max_tokens = max_tokens
        self.token_slots = torch.full((num_ves, max_tokens), -1, dtype=torch.int32, device=device)

    def slots(self, num_tokens: int) -> torch.Tensor:
        """The current VE's token slots [num_tokens] int32 (a view of its static buffer).

        Raises:
            ValueError: more tokens than the buffer holds.
        """
        if num_tokens > self.max_tokens:
            raise ValueError(
                f"a forward of {num_tokens} tokens is above the {self.max_tokens} the LoRA "
                "token-slot buffer holds."
            )
        return self.token_slots[current_virtual_engine(), :num_tokens]


class LoRALinear:
    """The slots of one linear layer (see the module doc).

    Args:
        slices: shard id -> (first output row, rows) of each fused output, in order
            (``LinearBase.output_slices``).
        in_features, out_features: the layer's (this rank's) sizes.
        num_ves, max_loras, max_rank: the slot table's dimensions.
        ctx: the shared :class:`LoRAContext`.
        dtype, device: the model's.
    """

    def __init__(self, slices: dict[object, tuple[int, int]], in_features: int,
                 out_features: int, num_ves: int, max_loras: int, max_rank: int,
                 ctx: LoRAContext, dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.slices = dict(slices)
        self.index = {sid: i for i, sid in enumerate(self.slices)}
        self.rank = max_rank
        self.per_slot = len(self.slices) * max_rank  # columns of one slot
        width = max_loras * self.per_slot
        self.ctx = ctx
        self.a = torch.zeros(num_ves, width, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_ves, out_features, width, dtype=dtype, device=device)
        # [width] int32: the slot each column belongs to
        self.col_slot = (torch.arange(width, device=device) // self.per_slot).to(torch.int32)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` [T, out] (the base layer's output for ``x`` [T, in]) plus each token's
        adapter term."""
        ve = current_virtual_engine()
        mask = self.ctx.slots(x.shape[0])[:, None] == self.col_slot  # [T, width] bool
        xa = F.linear(x, self.a[ve]) * mask  # [T, width]
        return y + F.linear(xa, self.b[ve])  # [T, out]

    def clear(self, ve: int, slot: int) -> None:
        """Zero slot ``slot`` of VE ``ve``."""
        cols = slice(slot * self.per_slot, (slot + 1) * self.per_slot)
        self.a[ve, cols].zero_()
        self.b[ve, :, cols].zero_()

    def write(self, ve: int, slot: int, shard_id: object, a: torch.Tensor, b: torch.Tensor) -> None:
        """Put one adapted module into slot ``slot`` of VE ``ve``.

        Args:
            shard_id: the slice it adapts; None: the whole fused output (``b``'s rows are
                split over the slices, each slice getting ``a``).
            a: [r, in]; b: [out of the slice (or of the layer), r], scale folded in.
        """
        if shard_id is None and len(self.slices) > 1:
            for sid, (offset, size) in self.slices.items():
                self.write(ve, slot, sid, a, b[offset : offset + size])
            return
        r = a.shape[0]
        offset, size = self.slices[shard_id]
        c0 = slot * self.per_slot + self.index[shard_id] * self.rank
        self.a[ve, c0 : c0 + r].copy_(a)  # [r, in]
        self.b[ve, offset : offset + size, c0 : c0 + r].copy_(b)  # [size, r]
