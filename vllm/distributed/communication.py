"""Point-to-point exchange of ``IntermediateTensors`` between consecutive pipeline stages.

No shape message is sent: every stage receives the same ``ExecuteModelRequest`` and builds
the same batch from it, so the receiver knows ``num_tokens`` (the batch's token rows,
padded lanes included), ``hidden_size`` and the model dtype already. Tensors travel in a
fixed key order (:data:`PP_TENSOR_KEYS`), one ``torch.distributed.send`` each; messages
between one pair of ranks arrive in the order sent, so steps stay matched as long as every
stage runs steps in the same order (the executor guarantees that).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vllm.sequence import IntermediateTensors

# The residual stream travels next to the hidden states (fused residual add in RMSNorm).
PP_TENSOR_KEYS = ("hidden_states", "residual")


def send_intermediate_tensors(tensors: IntermediateTensors, dst: int) -> None:
    """Send every tensor of ``tensors`` to rank ``dst`` (blocking until handed over).

    Args:
        tensors: must hold exactly :data:`PP_TENSOR_KEYS`, each [num_tokens, hidden].
        dst: the next stage's rank.

    Raises:
        ValueError: when the keys differ from :data:`PP_TENSOR_KEYS`.
    """
    keys = tuple(k for k, _ in tensors.items())
    if sorted(keys) != sorted(PP_TENSOR_KEYS):
        raise ValueError(f"IntermediateTensors keys {list(keys)} != expected {PP_TENSOR_KEYS}.")
    for key in PP_TENSOR_KEYS:
        dist.send(tensors[key].contiguous(), dst=dst)  # [num_tokens, hidden]


def recv_intermediate_tensors(
    num_tokens: int,
    hidden_size: int,
    dtype: torch.dtype,
    device: torch.device,
    src: int,
) -> IntermediateTensors:
    """Receive the previous stage's :data:`PP_TENSOR_KEYS` tensors for one step.

    Args:
        num_tokens: token rows of this step's batch (the same on every stage).
        hidden_size: the model's hidden size.
        dtype: the model dtype (what the sender's activations are in).
        device: where to place the buffers (the worker's device).
        src: the previous stage's rank.

    Returns:
        IntermediateTensors with ``hidden_states`` and ``residual``, each
        [num_tokens, hidden_size] of ``dtype`` on ``device``.
    """
    out = {}
    for key in PP_TENSOR_KEYS:
        buf = torch.empty(num_tokens, hidden_size, dtype=dtype, device=device)
        dist.recv(buf, src=src)  # [num_tokens, hidden]
        out[key] = buf
    return IntermediateTensors(out)
