"""What a request names to run with a LoRA adapter (upstream's ``LoRARequest``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT LoRA adapter for one request.

    Args:
        lora_name: the adapter's name (the server's model name for it).
        lora_int_id: a positive integer that identifies the adapter across requests: the
            engine caches the adapter's weights under it, and prefix-cache blocks computed
            with it are shared only with requests of the same id.
        lora_path: a directory holding ``adapter_config.json`` and
            ``adapter_model.safetensors`` (or ``adapter_model.bin``), as PEFT's
            ``save_pretrained`` writes them.
        base_model_name: the served name of the model it adapts (listed by the server's
            ``/v1/models`` as the adapter's parent); None: the served model.

    Raises:
        ValueError: an empty name or path, or an id below 1.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}.")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise ValueError(f"lora_int_id must be an integer, got {self.lora_int_id!r}.")
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be at least 1, got {self.lora_int_id}.")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(
                f"lora_path of adapter {self.lora_name!r} must name its directory, got "
                f"{self.lora_path!r}."
            )

    @property
    def adapter_id(self) -> int:
        """Upstream's alias of ``lora_int_id``."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
