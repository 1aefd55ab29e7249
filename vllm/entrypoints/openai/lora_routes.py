"""Adapters added and removed while ``vllm serve`` runs (upstream's runtime LoRA updating).

With ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` the server answers:

- ``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}``: the adapter is
  checked as a request's would be (vllm/lora/registry.py) and then served under its name;
  200 with a plain-text success line, 400 naming the problem (a name already served, LoRA
  off, an adapter the engine refuses). With ``"load_inplace": true`` (as upstream) a name
  already served as an adapter is replaced: new requests get the new directory's weights
  (read again, under a new id), running ones keep the old.
- ``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}``: the name stops being served
  (requests already running keep their adapter); 404 when no adapter has that name.

Each loaded adapter gets a ``lora_int_id`` never used before in this server, so a name
loaded again with another directory never meets the weights the workers cached for the old
one.
"""

from __future__ import annotations

import asyncio
import itertools

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from vllm.lora.request import LoRARequest


def add_lora_routes(
    app: FastAPI, engine: AsyncLLMEngine, loras: dict[str, LoRARequest], served: list[str]
) -> None:
    """Register the two routes on ``app``; ``loras`` is the servers' name -> adapter map
    the request handlers read (changed in place), ``served`` the base model's names."""
    next_id = itertools.count(max((lora.lora_int_id for lora in loras.values()), default=0) + 1)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest):
        name, path = body.lora_name, body.lora_path
        if not name or not path:
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.", 400, "lora_name")
        if name in served:
            raise APIError(
                f"'{name}' is the name of the served base model; give the adapter another name.",
                400,
                "lora_name",
            )
        if name in loras and not body.load_inplace:
            raise APIError(f"The lora adapter '{name}' has already been loaded.", 400, "lora_name")
        request = LoRARequest(name, next(next_id), path)
        try:  # reads the adapter's files: off the event loop
            await asyncio.to_thread(engine.engine.adapters.check, request)
        except ValueError as e:
            raise APIError(str(e), 400, "lora_path") from None
        loras[name] = request
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
        if loras.pop(body.lora_name, None) is None:
            raise APIError(
                f"The lora adapter '{body.lora_name}' cannot be found.", 404, "lora_name"
            )
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
