"""/pooling (upstream's Pooling API) on an engine started with ``--task embed``.

The request is the Embeddings API's (``input``: a text, texts, token ids or lists of them;
or chat ``messages``; ``encoding_format``, ``dimensions``, ``normalize``,
``truncate_prompt_tokens``, ``priority``); each input's
pooled vector comes back as ``data[i].data`` with ``object`` "pooling". For the embedding
models served here that vector is the embedding itself, so ``/pooling`` and
``/v1/embeddings`` return the same numbers (and ``LLM.encode``'s ``outputs.data``).
"""

from __future__ import annotations

import time

from fastapi import Request

from vllm.entrypoints.openai.protocol import OpenAIBaseModel, UsageInfo
from vllm.entrypoints.openai.serving_embedding import EmbeddingRequest
from vllm.entrypoints.openai.serving_pooling_base import PoolingServing, prompt_usage, vector_json


class PoolingRequest(EmbeddingRequest):
    """The body of POST /pooling: the Embeddings API's fields."""


class PoolingData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: list[float] | str


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class OpenAIServingPooling(PoolingServing):
    """Handler of /pooling."""

    async def create_pooling(self, req: PoolingRequest, raw: Request | None):
        """Returns a PoolingResponse, or None when the client went away.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        pooled = await self.pooled_inputs(req, raw, "Pooling", "pool")
        if pooled is None:
            return None
        base, inputs, vecs = pooled
        data = [PoolingData(index=i, data=vector_json(v, req.encoding_format))
                for i, v in enumerate(vecs)]  # fmt: skip
        return PoolingResponse(id=base, created=int(time.time()), model=self.model_for(req),
                               data=data, usage=prompt_usage(inputs))  # fmt: skip
