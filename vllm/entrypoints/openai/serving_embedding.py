"""/v1/embeddings (OpenAI's Embeddings API) on an engine started with ``--task embed``.

``input`` is a text, a list of texts, a list of token ids or a list of such lists; each
becomes one pooling request (vllm/pooling), all checked before any is queued.
``encoding_format`` "float" returns lists of floats, "base64" the float32 little-endian
bytes in base64 (what OpenAI's clients decode). ``dimensions`` cuts a Matryoshka model's
embeddings; other models refuse it. ``truncate_prompt_tokens`` keeps each input's last k
tokens (-1: the last ``max_model_len``, as for completions; k above ``max_model_len`` is a
400). A generative engine answers 400, as an embedding engine does to /v1/completions and
/v1/chat/completions.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Literal

import numpy as np
from fastapi import Request

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import OpenAIBaseModel, UsageInfo
from vllm.entrypoints.openai.request_streams import collect_final
from vllm.entrypoints.openai.serving_engine import OpenAIServing
from vllm.pooling_params import PoolingParams


class EmbeddingRequest(OpenAIBaseModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    priority: int = 0


class EmbeddingData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


class OpenAIServingEmbedding(OpenAIServing):
    """Handler of /v1/embeddings."""

    async def _inputs(self, req: EmbeddingRequest) -> list[list[int]]:
        """Token ids per input, each cut to its last ``truncate_prompt_tokens`` (-1:
        ``max_model_len``)."""
        items = req.input
        if isinstance(items, str) or (items and all(isinstance(t, int) for t in items)):
            items = [items]
        if not items:
            raise APIError("input must not be empty.", 400, "input")
        k = self.kept_tokens(req)  # -1: max_model_len; above it or below -1: 400
        out = []
        for item in items:
            ids = await self.item_ids(item, "input", bounded=k is None)
            if k is not None:
                ids = ids[-k:]
            if len(ids) > self.max_model_len:
                raise APIError(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, you requested {len(ids)} tokens in the input for embedding "
                    "generation. Please reduce the length of the input.",
                    400,
                    "input",
                )
            out.append(ids)
        return out

    async def create_embedding(self, req: EmbeddingRequest, raw: Request | None):
        """Returns an EmbeddingResponse, or None when the client went away.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        self.check_model(req.model)
        if self.engine.pooler_config is None:
            raise APIError("The model does not support the Embeddings API (serve it with "
                           "--task embed).", 400, "model")  # fmt: skip
        try:
            params = PoolingParams(dimensions=req.dimensions)
            self.engine.check_pooling_params(params)
        except ValueError as e:
            raise APIError(str(e), 400, "dimensions") from None
        inputs = await self._inputs(req)
        for ids in inputs:
            self.check_schedulable(len(ids), 1)
        base = f"embd-{uuid.uuid4().hex}"
        lora = self.lora_for(req)
        gens = [
            self.engine.encode(
                {"prompt_token_ids": ids}, params, f"{base}-{i}", lora, req.priority
            )  # fmt: skip
            for i, ids in enumerate(inputs)
        ]
        try:
            outs = await asyncio.gather(*(collect_final(g, raw) for g in gens))
        except ValueError as e:
            raise APIError(str(e), 400, "input") from None
        if any(o is None for o in outs):
            for g in gens:
                await g.aclose()
            return None
        data = []
        for i, out in enumerate(outs):
            vec = out.outputs.data.numpy().astype("<f4")  # [dimensions]
            emb = vec.tolist() if req.encoding_format == "float" else _b64(vec)
            data.append(EmbeddingData(index=i, embedding=emb))
        n = sum(len(ids) for ids in inputs)
        # completion_tokens 0, as upstream sends it: clients that add usages need a number
        usage = UsageInfo(prompt_tokens=n, total_tokens=n, completion_tokens=0)
        return EmbeddingResponse(id=base, created=int(time.time()), model=self.model_for(req),
                                 data=data, usage=usage)  # fmt: skip


def _b64(vec: np.ndarray) -> str:
    """float32 little-endian bytes, base64 (what OpenAI's clients decode)."""
    return base64.b64encode(vec.tobytes()).decode("ascii")
