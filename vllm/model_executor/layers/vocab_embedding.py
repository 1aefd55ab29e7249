"""Token embedding and LM head (no tensor parallelism: the full vocabulary on every rank)."""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.kernels.dispatch import get_triton_gemv
from vllm.model_executor.weight_utils import default_weight_loader


class VocabParallelEmbedding(nn.Module):
    """Embedding table ``weight`` [vocab_size, hidden]; forward maps ids [T] -> [T, hidden]."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.weight.weight_loader = default_weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [num_tokens, hidden]

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}"


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection ``weight`` [vocab_size, hidden]; used through ``compute_logits``.

    ``tie_weights(embedding)`` shares the embedding's parameter (tied checkpoints).
    """

    def tie_weights(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by compute_logits, not called directly")

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [N, hidden] -> logits [N, vocab_size] in float32. One row of a
        large head (Llama-3.1-8B's 1 GB) runs the whole-row Triton GEMV when
        ``get_triton_gemv`` allows it and the head fits that kernel (``rows_kernel_fits``,
        the case measured faster than cuBLAS: vllm/kernels/gemv.py);
        every other head stays on cuBLAS."""
        gemv = get_triton_gemv(hidden_states, self.weight)
        if gemv is not None and gemv.rows_kernel_fits(*self.weight.shape):
            return gemv.linear(hidden_states, self.weight).float()  # [1, vocab_size]
        return F.linear(hidden_states, self.weight).float()  # [N, vocab_size]
