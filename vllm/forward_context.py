"""Which virtual engine the forward pass running now belongs to, and whether the host reads
its sampled ids now or only at the end of its call.

Layers that keep state per virtual engine (the LoRA slots of vllm/lora/layers.py) read
:func:`current_virtual_engine` while the model runs; the model runner sets it around every
eager forward and the graph capture around every virtual engine's captures (a replayed
graph runs the kernels captured for its own virtual engine, so a replay needs nothing).
Upstream vLLM keeps the same value in its forward context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_virtual_engine = 0
_read_deferred = False


def current_virtual_engine() -> int:
    """The virtual engine of the forward pass running now (0 outside any)."""
    return _virtual_engine


@contextmanager
def set_forward_context(virtual_engine: int) -> Iterator[None]:
    """Run the block as a forward pass of ``virtual_engine`` (restored on exit)."""
    global _virtual_engine
    previous, _virtual_engine = _virtual_engine, virtual_engine
    try:
        yield
    finally:
        _virtual_engine = previous


def host_read_deferred() -> bool:
    """Whether the logits being computed now are sampled on the device and their ids read by
    the host only at the end of the call (a multi-step call's passes before its last)."""
    return _read_deferred


@contextmanager
def deferred_host_read(deferred: bool = True) -> Iterator[None]:
    """Compute and sample the block's logits as a pass whose ids the host does not read
    now (``deferred``; restored on exit). On a GPU this changes nothing: a read is what
    synchronizes, and none happens. The pipeline simulator's stand-in device
    (vllm/model_executor/model_loader/sim_model.py) waits for its forward only where the
    host reads, so it needs to be told."""
    global _read_deferred
    previous, _read_deferred = _read_deferred, deferred
    try:
        yield
    finally:
        _read_deferred = previous
