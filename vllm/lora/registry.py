"""The engine side of LoRA: every adapter a request names is checked before it is queued.

A :class:`LoRARequest` is checked once per ``lora_int_id`` (its directory read, its rank
and tensor shapes compared with the model and ``--max-lora-rank``; vllm/lora/adapter.py);
later requests with the same id must name the same directory, since the workers cache the
adapter's weights under the id. Each registration of an id gets a serial number of its own,
which prefix-cache block hashes include (:meth:`AdapterRegistry.block_hash_key`): once an id
is removed (``remove_lora``) and names another adapter, blocks computed with the old one are
never found for the new one.
"""

from __future__ import annotations

import itertools

from vllm.lora.adapter import AdapterSpec, check_adapter
from vllm.lora.request import LoRARequest


class AdapterRegistry:
    """Adapters seen by one engine.

    Args:
        lora_config: the engine's LoRAConfig, or None when LoRA is off.
        hf_config: the served model's Hugging Face config.
        supported: PEFT module names the model can adapt.
    """

    def __init__(self, lora_config, hf_config, supported: tuple[str, ...]):
        self.config = lora_config
        self.hf_config = hf_config
        self.supported = supported
        self.specs: dict[int, tuple[LoRARequest, AdapterSpec]] = {}
        self._serials: dict[int, int] = {}  # lora id -> its registration's serial number
        self._next_serial = itertools.count(1)

    def block_hash_key(self, request: LoRARequest) -> tuple[int, int]:
        """What prefix-cache blocks computed with ``request``'s adapter are keyed by: its id
        and the serial number of the id's registration (a checked request's)."""
        return (request.lora_int_id, self._serials.get(request.lora_int_id, 0))

    def check(self, request: object) -> None:
        """Check a request's ``lora_request`` (None passes).

        Raises:
            ValueError: LoRA is off, ``request`` is not a LoRARequest, its id already names
                another directory, or the adapter does not fit the model or the limits
                (see :func:`~vllm.lora.adapter.check_adapter`).
        """
        if request is None:
            return
        if self.config is None:
            raise ValueError(
                "a request names a LoRA adapter but the engine runs without LoRA; start it "
                "with enable_lora=True (--enable-lora)."
            )
        if not isinstance(request, LoRARequest):
            raise ValueError(
                f"lora_request must be a vllm.lora.request.LoRARequest, got "
                f"{type(request).__name__}."
            )
        known = self.specs.get(request.lora_int_id)
        if known is not None:
            if known[0].lora_path != request.lora_path:
                raise ValueError(
                    f"lora_int_id={request.lora_int_id} already names adapter "
                    f"{known[0].lora_name!r} at {known[0].lora_path!r}; give "
                    f"{request.lora_path!r} another id."
                )
            return
        spec = check_adapter(
            request.lora_path, self.hf_config, self.supported, self.config.max_lora_rank
        )
        self.specs[request.lora_int_id] = (request, spec)
        self._serials[request.lora_int_id] = next(self._next_serial)
