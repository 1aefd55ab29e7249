"""Upstream's adapter calls on the engine: ``add_lora``, ``remove_lora``, ``list_loras`` and
``pin_lora`` (``LLMEngine`` mixes them in; requests name adapters with a LoRARequest and
need none of them, the workers read an adapter at its first step).

The engine's :class:`~vllm.lora.registry.AdapterRegistry` holds the adapters it knows (each
checked once); every worker rank's :class:`~vllm.lora.manager.LoRAManager` holds their
tensors, so each call checks on the engine side first and then reaches every rank.
"""

from __future__ import annotations

from vllm.lora.request import LoRARequest


class LoRAMethods:
    """The calls; the class they are mixed into provides ``adapters`` (the registry) and
    ``executor`` (with ``collective_rpc``)."""

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check an adapter and read it into every worker's host cache now (it still takes
        a slot only when a step uses it). Returns True.

        Raises:
            ValueError: LoRA is off, or the adapter is refused (see
                :meth:`~vllm.lora.registry.AdapterRegistry.check`: its id naming another
                directory, a rank above ``max_lora_rank``, shapes that do not fit, ...).
        """
        if lora_request is None:
            raise ValueError("add_lora needs a LoRARequest, got None.")
        self.adapters.check(lora_request)
        self.executor.collective_rpc("lora_call", "add", lora_request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Forget adapter ``lora_id`` on the engine and every worker (host tensors, pin,
        slots). A request that names it later is checked and read again, so the id may then
        name another directory. Returns False when the id is not known."""
        if self.adapters.specs.pop(lora_id, None) is None:
            return False
        self.executor.collective_rpc("lora_call", "remove", lora_id)
        return True

    def list_loras(self) -> set[int]:
        """The ids of the adapters the engine knows (added, or named by a request)."""
        return set(self.adapters.specs)

    def pin_lora(self, lora_id: int) -> bool:
        """Keep adapter ``lora_id`` in every worker's host cache whatever ``max_cpu_loras``
        allows (upstream's pin). Returns True.

        Raises:
            ValueError: the id is not known (add it first with :meth:`add_lora`).
        """
        known = self.adapters.specs.get(lora_id)
        if known is None:
            raise ValueError(
                f"LoRA adapter {lora_id} is not known to the engine; add it first "
                f"(add_lora), known: {sorted(self.adapters.specs)}."
            )
        self.executor.collective_rpc("lora_call", "pin", known[0])
        return True
