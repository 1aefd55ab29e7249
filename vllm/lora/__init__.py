"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"):
PEFT-format adapters served beside the base model, several per batch.

- :mod:`vllm.lora.request`: :class:`LoRARequest`, what a request names.
- :mod:`vllm.lora.config`: :class:`LoRAConfig` (``--enable-lora``, ``--max-loras``,
  ``--max-lora-rank``, ``--max-cpu-loras``).
- :mod:`vllm.lora.adapter`: reading and checking a PEFT adapter directory.
- :mod:`vllm.lora.layers`: the per-layer slots and the batched LoRA product.
- :mod:`vllm.lora.manager`: the worker side: slots per virtual engine, each token's slot.
"""

from vllm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
