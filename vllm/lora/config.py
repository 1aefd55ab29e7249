"""LoRAConfig: how many adapters the engine serves and how large (upstream's flags)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRAConfig:
    """LoRA serving limits (``--enable-lora`` builds one; None in the engine otherwise).

    Args:
        max_loras: adapters one step may use (per virtual engine): slots on the device,
            >= 1 (upstream's default 1).
        max_lora_rank: the largest adapter rank ``r`` served, >= 1 (default 16); every slot
            is this wide, so it sets the LoRA GEMMs' width.
        max_cpu_loras: adapters kept read on the host, >= ``max_loras``; None: ``max_loras``.

    Raises:
        ValueError: a value below its floor, naming it.
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}.")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras={self.max_cpu_loras} must be at least max_loras={self.max_loras}."
            )
