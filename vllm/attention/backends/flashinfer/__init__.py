"""The FLASHINFER attention backend, as a package whose modules import one way only:

- :mod:`.paged_cache` (bottom): a step's page tables in FlashInfer's form, slot / key /
  value rows of new tokens, the cache write;
- :mod:`.metadata`: the planned-wrapper path's metadata and attention;
  :mod:`.flashinfer_prefill`: the capturable one-sequence prefill;
  :mod:`.small_decode`: the Triton small-batch decode path;
  :mod:`.loop_plan`: one plan per multi-step call and the on-device advance of a
  decode-loop graph; :mod:`.prebuild`: FlashInfer's modules built ahead of first use;
- :mod:`.flashinfer_graph`: one virtual engine's CUDA-graph state over those paths;
- :mod:`.flashinfer` (top): :class:`FlashInferBackend`, which picks a path per step.
"""

from vllm.attention.backends.flashinfer.flashinfer import FlashInferBackend

__all__ = ["FlashInferBackend"]
