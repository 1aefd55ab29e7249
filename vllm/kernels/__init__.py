"""The engine's Triton kernels, a leaf package (it imports nothing from ``vllm`` but
:mod:`vllm.envs`).

- :mod:`~vllm.kernels.norm_rotary`: RMSNorm (with the residual add), SiLU-and-mul and NeoX
  rotary embedding (with FLASHINFER's cache write fused in), one launch each.
- :mod:`~vllm.kernels.gemv`, :mod:`~vllm.kernels.gemv_rows`: one-row projections with the
  decoder's norms and activation fused in (tiled; persistent whole-row for large weights).
- :mod:`~vllm.kernels.greedy`: greedy sampling in two launches.
- :mod:`~vllm.kernels.decode_step`: a decode-loop step's bookkeeping (samples, ids,
  positions, FLASHINFER's page lengths and slots) in one launch each.
- :mod:`~vllm.kernels.decode_attention`: FLASHINFER's small-batch paged decode attention.
- :mod:`~vllm.kernels.pdl`: programmatic dependent launch for the decode-path kernels.
- :mod:`~vllm.kernels.dispatch`: whether a call takes one of these kernels or the torch
  code; the only module the rest of the engine imports. It imports the kernel modules
  (and so ``triton``) on first use only.
"""
