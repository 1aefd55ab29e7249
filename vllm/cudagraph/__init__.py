"""CUDA graphs of the V0 engine, in one package.

- :mod:`~vllm.cudagraph.sizes`: the capture-size rules (decode batch sizes, prefill token
  counts, decode-loop sizes) and the :class:`GraphSpec` a stage captures;
- :mod:`~vllm.cudagraph.runner`: :class:`GraphRunner`, which plans each step
  (:class:`Plan`: pad, replay or eager and why) and runs it, with or without graphs;
- :mod:`~vllm.cudagraph.graph_set`: capture per virtual engine (separate buffers, one pool);
- :mod:`~vllm.cudagraph.piecewise`: graphs of everything between attention calls, for
  prefill and mixed steps (attention eager between replays);
- :mod:`~vllm.cudagraph.decode_loop`: graphs that run a whole greedy decode step;
- :mod:`~vllm.cudagraph.memory`: the graph-memory estimate taken before the KV cache;
- :mod:`~vllm.cudagraph.counters`: replayed and eager step counters;
- :mod:`~vllm.cudagraph.capture`: the injectable graph factory and the static inputs.
"""

from vllm.cudagraph.capture import GraphCapturer
from vllm.cudagraph.counters import DecodeStepCounters
from vllm.cudagraph.runner import GraphRunner, Plan
from vllm.cudagraph.sizes import CaptureSizes, GraphSpec, capture_sizes, graph_spec

__all__ = [
    "CaptureSizes",
    "DecodeStepCounters",
    "GraphCapturer",
    "GraphRunner",
    "GraphSpec",
    "Plan",
    "capture_sizes",
    "graph_spec",
]
