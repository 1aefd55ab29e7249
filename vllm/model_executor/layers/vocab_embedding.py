"""Token embedding and LM head, split over the vocabulary under tensor parallelism.

With ``tp`` ranks (1 without a group: the full table, computed exactly as ``F.embedding``
and ``F.linear``) the vocabulary is padded to ``tp * shard`` rows, ``shard = ceil(vocab /
tp)``; rank ``r`` holds rows ``[r * shard, (r + 1) * shard)`` (padding rows past the
vocabulary are zero, so any vocabulary size works).

- :class:`VocabParallelEmbedding`: each rank looks up the ids it owns (zero rows for the
  others) and the rows are all-reduced: one non-zero term per row, so the sum is exact.
- :class:`ParallelLMHead`: each rank computes the logits of its rows; they are gathered on
  TP rank 0 of the stage (the sampling rank), padding columns dropped; other ranks get None.
"""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.distributed.tp_ops import tensor_model_parallel_all_reduce, tensor_model_parallel_gather
from vllm.kernels.dispatch import get_triton_gemv
from vllm.model_executor.weight_utils import default_weight_loader, narrow_weight, weight_shape


class VocabParallelEmbedding(nn.Module):
    """Embedding table ``weight`` [shard, hidden] (this rank's rows); forward maps ids [T]
    -> [T, hidden] (see module docstring)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.num_embeddings = num_embeddings  # the whole vocabulary
        self.embedding_dim = embedding_dim
        self.shard_size = -(-num_embeddings // self.tp_size)  # ceil
        self.vocab_start = self.tp_rank * self.shard_size
        # rows of this shard that are real tokens (the rest is padding)
        self.num_real = max(0, min(self.shard_size, num_embeddings - self.vocab_start))
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight) -> None:
        """Copy this rank's rows of the checkpoint table [vocab, hidden]; padding rows 0.

        Raises:
            ValueError: a table whose shape is not [num_embeddings, embedding_dim].
        """
        if self.tp_size == 1:
            default_weight_loader(param, loaded_weight)
            return
        expected = (self.num_embeddings, self.embedding_dim)
        if weight_shape(loaded_weight) != expected:
            raise ValueError(
                f"checkpoint table has shape {weight_shape(loaded_weight)}, expected {expected}"
            )
        param.data.zero_()
        rows = narrow_weight(loaded_weight, 0, self.vocab_start, self.num_real)
        param.data[: self.num_real].copy_(rows)  # [num_real, hidden]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [num_tokens, hidden]
        local = input_ids - self.vocab_start  # [num_tokens]
        outside = (local < 0) | (local >= self.shard_size)  # [num_tokens] bool
        emb = F.embedding(local.masked_fill(outside, 0), self.weight)  # [num_tokens, hidden]
        emb = emb.masked_fill(outside.unsqueeze(-1), 0.0)
        return tensor_model_parallel_all_reduce(emb)  # [num_tokens, hidden]

    def extra_repr(self) -> str:
        return (
            f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
            f"tp_size={self.tp_size}, shard=[{self.vocab_start}, "
            f"{self.vocab_start + self.shard_size})"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection ``weight`` [shard, hidden]; used through ``compute_logits``.

    ``tie_weights(embedding)`` shares the embedding's parameter (tied checkpoints; both are
    split the same way).
    """

    def tie_weights(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by compute_logits, not called directly")

    def compute_logits(
        self, hidden_states: torch.Tensor, float32: bool = True
    ) -> torch.Tensor | None:
        """hidden_states [N, hidden] -> logits [N, vocab_size] in float32 on TP rank 0 (None
        on the other TP ranks); ``float32=False`` leaves them in the weight's dtype (the
        greedy kernel widens them itself: vllm/kernels/greedy.py). One row of a large head
        (Llama-3.1-8B's 1 GB) runs the whole-row Triton GEMV when ``get_triton_gemv``
        allows it and the head fits that kernel (``rows_kernel_fits``, the case measured
        faster than cuBLAS: vllm/kernels/gemv.py); every other head stays on cuBLAS."""
        gemv = get_triton_gemv(hidden_states, self.weight)
        if gemv is not None and gemv.rows_kernel_fits(*self.weight.shape):
            logits = gemv.linear(hidden_states, self.weight)  # [1, shard]
        else:
            logits = F.linear(hidden_states, self.weight)  # [N, shard]
        if float32:
            logits = logits.float()  # [N, shard]
        if self.tp_size == 1:
            return logits  # [N, vocab_size]
        full = tensor_model_parallel_gather(logits, dim=-1)  # [N, tp * shard] on TP rank 0
        return None if full is None else full[:, : self.num_embeddings]  # [N, vocab_size]
