"""Which virtual engine the forward pass running now belongs to.

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
