"""A one-way channel between two processes of one host: a shared-memory byte ring and a
pipe that wakes the receiver.

What it replaces. Between the mp executor's stage processes, plan headers (and on CPU the
hidden states and sampled ids) used to travel over gloo. A gloo message costs each side a
few hundred microseconds of host time whatever its size (a tensor-pair round on a 2-core
machine: about 0.45 ms of CPU per side), in gloo's own threads and their wake-ups; a stage
of a 4-stage pipeline on 2 cores spent half its CPU there. Here a message is one copy into
shared memory and one byte written to a pipe; the receiver blocks in ``os.read`` on that
pipe (no polling) and copies the bytes out (about 0.1 ms per side for the same pair).

Protocol (one sender, one receiver, messages received in the order sent):

- The sender places a message of ``n`` bytes at ``head % capacity``, or at offset 0 when
  it would cross the ring's end (the bytes skipped count as used), advances ``head`` and
  writes one byte to the pipe.
- The receiver reads one byte, applies the same placement rule to its ``tail`` (it knows
  ``n``: it receives into a buffer of the message's size), copies the bytes out and
  publishes its ``tail`` in shared memory, under a lock so the sender's read of it is
  ordered after the copy on any memory model.
- A message takes the ring when it is at most half its size (:meth:`HostChannel.carries`,
  the same answer on both ends); a larger one goes over gloo. The ring holds at least
  two of the largest messages a step sends (:func:`ring_bytes`). Should it be full, the
  sender sleeps until the receiver frees space: back-pressure that cannot deadlock the
  pipeline, since every stage down the pipeline makes progress (the last stage never
  waits on a send) and the channel back to stage 0 carries only sampled ids, a few KiB
  per virtual engine in flight, so it never fills.

The shared memory and the pipe are multiprocessing objects, so a channel is inherited by
forked workers and pickled to spawned ones (``Process`` arguments).
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import torch

# The least ring size, bytes: plan headers and sampled ids alone need a few KiB.
MIN_RING_BYTES = 1 << 20
# The largest ring, bytes: a message above half of it goes over gloo instead.
MAX_RING_BYTES = 1 << 26
# The sender's sleep while the ring is full (back-pressure, see the module doc), seconds.
FULL_SLEEP_S = 1e-4


def ring_bytes(max_message: int) -> int:
    """The ring size for messages of up to ``max_message`` bytes: four of them (two
    always fit, whatever the bytes lost at the ring's end), clamped to
    [:data:`MIN_RING_BYTES`, :data:`MAX_RING_BYTES`]."""
    return max(MIN_RING_BYTES, min(MAX_RING_BYTES, 4 * max_message))


class HostChannel:
    """One direction between two processes of one host (module doc).

    Args:
        ctx: the multiprocessing context the processes start with (its shared memory,
            pipe and lock survive fork and spawn).
        capacity: ring bytes (:func:`ring_bytes`).

    Attributes:
        max_message: the largest message (bytes) the ring carries, half its capacity;
            :meth:`carries` says whether a message goes this way, identically on both ends.
    """

    def __init__(self, ctx: Any, capacity: int):
        self.capacity = int(capacity)
        self.max_message = self.capacity // 2
        self._raw = ctx.RawArray(ctypes.c_uint8, self.capacity)
        self._tail_raw = ctx.RawArray(ctypes.c_int64, 1)  # bytes the receiver consumed
        self._lock = ctx.Lock()
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._pos = 0  # this end's head (sender) or tail (receiver), bytes since start
        self._ring: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_ring"] = None  # a view of the shared memory: rebuilt in the new process
        return state

    def _view(self) -> torch.Tensor:
        if self._ring is None:
            self._ring = torch.frombuffer(self._raw, dtype=torch.uint8)  # [capacity]
        return self._ring

    def fileno(self) -> int:
        """The receiver's pipe: readable (``select``) once a message is waiting, and left
        unread by the test, so :meth:`recv_into` still takes that message."""
        return self._reader.fileno()

    def carries(self, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` bytes travels on this channel (else gloo)."""
        return 0 < nbytes <= self.max_message

    def _place(self, pos: int, nbytes: int) -> int:
        """Where a message of ``nbytes`` starts when the stream is at ``pos`` (module doc)."""
        off = pos % self.capacity
        return pos if off + nbytes <= self.capacity else pos + self.capacity - off

    def send(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (a CPU tensor of at most ``max_message`` bytes, any dtype and
        shape) into the ring and wake the receiver. Waits for the receiver only while the
        ring is full.

        Raises:
            ValueError: the tensor is larger than ``max_message``.
        """
        src = tensor.contiguous().view(-1).view(torch.uint8)  # [nbytes]
        n = src.numel()
        if not self.carries(n):
            raise ValueError(
                f"a {n}-byte message exceeds this channel's {self.max_message}-byte limit."
            )
        start = self._place(self._pos, n)
        while start + n - self._consumed() > self.capacity:  # full: back-pressure
            time.sleep(FULL_SLEEP_S)
        off = start % self.capacity
        self._view()[off : off + n].copy_(src)
        self._pos = start + n
        os.write(self._writer.fileno(), b"\x01")

    def recv_into(self, buf: torch.Tensor) -> torch.Tensor:
        """Block until the next message arrives and copy it into ``buf`` (a contiguous CPU
        tensor of exactly the message's bytes); returns ``buf``.

        Raises:
            EOFError: the pipe was closed (the sender is gone).
        """
        if not os.read(self._reader.fileno(), 1):
            raise EOFError("the sending process closed its host channel.")
        dst = buf.view(-1).view(torch.uint8)  # [nbytes]
        n = dst.numel()
        start = self._place(self._pos, n)
        off = start % self.capacity
        dst.copy_(self._view()[off : off + n])
        self._pos = start + n
        with self._lock:  # orders the copy before the sender sees the space free
            self._tail_raw[0] = self._pos
        return buf

    def _consumed(self) -> int:
        with self._lock:
            return int(self._tail_raw[0])


def pipeline_channels(
    ctx: Any, world_size: int, tp_size: int, max_message: int
) -> dict[tuple[int, int], HostChannel]:
    """The channels of a pipeline on one host, keyed ``(src rank, dst rank)``: each rank to
    its peer of the next stage (``rank + tp_size``), and the sampling rank (TP rank 0 of
    the last stage) to rank 0 (sampled ids). Empty without pipeline stages.

    Args:
        ctx: the workers' multiprocessing context.
        world_size: ``tp_size x pp_size`` ranks.
        tp_size: ranks per stage.
        max_message: the largest message, bytes, the channels should carry (within
            :data:`MAX_RING_BYTES` / 2; larger ones go over gloo).
    """
    if world_size <= tp_size:
        return {}
    size = ring_bytes(max_message)
    pairs = [(r, r + tp_size) for r in range(world_size - tp_size)]
    pairs.append((world_size - tp_size, 0))
    return {pair: HostChannel(ctx, size) for pair in pairs}
