"""``vllm serve --lora-modules``: LoRA adapters served under model names of their own.

Each value is ``NAME=PATH`` or a JSON object ``{"name": ..., "path": ...,
"base_model_name": ...}`` (upstream's two forms). A request whose ``model`` is ``NAME``
runs with that adapter; ``/v1/models`` lists it with the base model as its parent.
"""

from __future__ import annotations

import argparse
import json

from vllm.lora.request import LoRARequest


def parse_lora_module(text: str) -> tuple[str, str, str | None]:
    """One ``--lora-modules`` value -> (name, path, base model name or None).

    Raises:
        argparse.ArgumentTypeError: neither ``NAME=PATH`` nor a JSON object with a
            non-empty ``name`` and ``path``.
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(
                f"invalid JSON in --lora-modules {text!r}: {e}"
            ) from None
        name, path = obj.get("name"), obj.get("path")
        base = obj.get("base_model_name")
        extra = set(obj) - {"name", "path", "base_model_name"}
        if extra:
            raise argparse.ArgumentTypeError(
                f"--lora-modules {text!r}: unknown keys {sorted(extra)} (name, path, "
                "base_model_name)"
            )
    else:
        name, sep, path = text.partition("=")
        base = None
        if not sep:
            raise argparse.ArgumentTypeError(
                f"--lora-modules {text!r}: expected NAME=PATH or a JSON object"
            )
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise argparse.ArgumentTypeError(
            f"--lora-modules {text!r}: the name and the path must both be non-empty"
        )
    return name, path, base


def lora_requests(modules: list[tuple[str, str, str | None]] | None, served: list[str],
                  enable_lora: bool) -> list[LoRARequest]:  # fmt: skip
    """The adapters of ``--lora-modules`` as LoRARequests, ids 1, 2, ... in order.

    Raises:
        ValueError: adapters without ``--enable-lora``, or a name used twice or already a
            served model name.
    """
    if not modules:
        return []
    if not enable_lora:
        raise ValueError("--lora-modules needs --enable-lora.")
    seen = set(served)
    out = []
    for i, (name, path, base) in enumerate(modules, start=1):
        if name in seen:
            raise ValueError(
                f"--lora-modules name {name!r} is already a served model or adapter name."
            )
        seen.add(name)
        out.append(LoRARequest(name, i, path, base))
    return out
