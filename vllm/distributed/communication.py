"""Point-to-point exchange between pipeline stages: hidden states forward, a step's plan
header forward, sampled token ids from the last stage back to the first.

Hidden states and ids are device tensors (NCCL on CUDA: ordered on the streams, the host
never waits for them). Plan headers are host values a stage needs before it launches a
pass, so they travel between hosts (gloo, the pipeline's ``host_group`` on CUDA).

No shape message is sent: every stage receives the same ``ExecuteModelRequest`` and builds
the same batch from it, so the receiver knows ``num_tokens`` (the batch's token rows,
padded lanes included), ``hidden_size`` and the model dtype already; the plan header
(vllm/worker/pp_stage.py) lets it check that before the hidden states arrive. Tensors
travel stacked in one message, in a fixed key order (:data:`PP_TENSOR_KEYS`); messages
between one pair of ranks arrive in the order sent, so steps stay matched as long as every
stage runs steps in the same order (the executor guarantees that).

Sends do not wait for the receiver: on gloo each is an ``isend`` whose work and tensor are
kept (:data:`_PENDING`) until it completes, so a stage starts its next step while the next
stage still works on the previous one, and a stage sending ids back to stage 0 never
deadlocks against stage 0 sending hidden states forward. On NCCL the send is ordered on
the device stream (``work.wait()`` does not block the host).

Host channels. Under the mp executor every stage runs on one host, and each message that
travels as host data (plan headers; on CPU also hidden states and ids) goes through a
shared-memory channel instead of gloo when the executor installed one for that pair of
ranks (:func:`install_host_channels`, vllm/distributed/host_channel.py) and the message
fits it: a pipe write and a copy instead of gloo's few hundred microseconds of host time
per message. Sender and receiver decide the way alike (the pair, the device, the bytes),
and each way keeps its messages in order, so the matching above holds. A channel's send
waits only while its ring is full (back-pressure toward the next stage, which always makes
progress; the channel of ids back to stage 0 never fills: see host_channel.py).
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist

from vllm.sequence import IntermediateTensors

# The residual stream travels next to the hidden states (fused residual add in RMSNorm).
PP_TENSOR_KEYS = ("hidden_states", "residual")
# The most gloo sends kept in flight before the oldest is waited for.
MAX_PENDING_SENDS = 64
# (work, tensor) of gloo sends not known to be complete, oldest first.
_PENDING: deque = deque()
# (src rank, dst rank) -> HostChannel, and this process's rank (install_host_channels).
_CHANNELS: dict = {}
_RANK: list[int] = [-1]


def install_host_channels(channels: dict, rank: int) -> None:
    """Use ``channels`` (``{(src, dst): HostChannel}``, vllm/distributed/host_channel.py;
    the ones this rank sends or receives on) for host data between these pairs of ranks
    from now on; an empty dict uninstalls them."""
    _CHANNELS.clear()
    _CHANNELS.update({k: v for k, v in channels.items() if rank in k})
    _RANK[0] = rank


def _channel(src: int, dst: int, tensor: torch.Tensor):
    """The host channel a message of ``tensor``'s bytes takes from ``src`` to ``dst``, or
    None (gloo or NCCL): the same answer on both ends."""
    chan = _CHANNELS.get((src, dst))
    if chan is None or tensor.is_cuda or not chan.carries(tensor.numel() * tensor.element_size()):
        return None
    return chan


def _recv(buf: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """Receive the next message from ``src`` into ``buf`` (by its host channel when it
    has one, else on ``group``)."""
    chan = _channel(src, _RANK[0], buf)
    if chan is not None:
        return chan.recv_into(buf)
    dist.recv(buf, src=src, group=group)
    return buf


def incoming_fd(src: int, device: torch.device) -> int | None:
    """A file descriptor that turns readable (``select``) once the next message from rank
    ``src`` of a tensor on ``device`` has arrived, or None when such messages do not take
    a host channel (no channel installed, or a CUDA tensor: NCCL, which the host never
    waits on). Lets a stage wait on its neighbour and on the executor's pipe at once.
    Exact for host values that always fit a channel (plan headers, sampled ids)."""
    chan = _CHANNELS.get((src, _RANK[0]))
    if chan is None or device.type == "cuda":
        return None
    return chan.fileno()


def send_tensor(tensor: torch.Tensor, dst: int, group=None) -> None:
    """Send ``tensor`` to rank ``dst`` (on ``group``; None: the world group) without
    waiting for the receiver (see module doc)."""
    chan = _channel(_RANK[0], dst, tensor)
    if chan is not None:
        chan.send(tensor)
        return
    tensor = tensor.contiguous()
    work = dist.isend(tensor, dst=dst, group=group)
    if tensor.is_cuda:
        work.wait()  # NCCL: orders the send on the current stream; the host goes on
        return
    _PENDING.append((work, tensor))
    while _PENDING and (len(_PENDING) > MAX_PENDING_SENDS or _PENDING[0][0].is_completed()):
        _PENDING.popleft()[0].wait()


def send_int_tensor(values: torch.Tensor, dst: int) -> None:
    """Send an int64 tensor (a plan header [k] or sampled ids [rows]) to rank ``dst``."""
    send_tensor(values.to(torch.long), dst)


def send_header(values: list[int], dst: int, group=None) -> None:
    """Send a plan header (a few ints) to rank ``dst`` as host data, on ``group`` (the
    pipeline's gloo ``host_group``; None: the world group, gloo on CPU), not waiting for
    the receiver."""
    send_tensor(torch.tensor(values, dtype=torch.long), dst, group)


def recv_header(n: int, src: int, group=None) -> list[int]:
    """Receive the ``n`` ints of a plan header from rank ``src`` on ``group`` (as
    :func:`send_header`). Host to host: the caller learns it as soon as it arrives, never
    waiting for its own device (reading an int tensor received by NCCL would)."""
    return _recv(torch.empty(n, dtype=torch.long), src, group).tolist()  # [n]


def recv_int_tensor(n: int, device: torch.device, src: int) -> torch.Tensor:
    """Receive ``n`` int64 values from rank ``src``: [n] int64 on ``device``."""
    return _recv(torch.empty(n, dtype=torch.long, device=device), src)  # [n]


def send_intermediate_tensors(tensors: IntermediateTensors, dst: int) -> None:
    """Send every tensor of ``tensors`` to rank ``dst`` (not waiting for the receiver).

    Args:
        tensors: must hold exactly :data:`PP_TENSOR_KEYS`, each [num_tokens, hidden].
        dst: the next stage's rank.

    Raises:
        ValueError: when the keys differ from :data:`PP_TENSOR_KEYS`.
    """
    keys = tuple(k for k, _ in tensors.items())
    if sorted(keys) != sorted(PP_TENSOR_KEYS):
        raise ValueError(f"IntermediateTensors keys {list(keys)} != expected {PP_TENSOR_KEYS}.")
    # one message, not one per key: each message costs a gloo pair a few hundred us of
    # host time whatever its size, an NCCL send a kernel launch
    send_tensor(torch.stack([tensors[key] for key in PP_TENSOR_KEYS]), dst)  # [2, tokens, hidden]


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
    buf = torch.empty(len(PP_TENSOR_KEYS), num_tokens, hidden_size, dtype=dtype, device=device)
    _recv(buf, src)  # [2, num_tokens, hidden]: the keys in order, one message
    return IntermediateTensors({key: buf[i] for i, key in enumerate(PP_TENSOR_KEYS)})
