"""/v1/embeddings (OpenAI's Embeddings API) on an engine started with ``--task embed``.

``input`` is a text, a list of texts, a list of token ids or a list of such lists; each
becomes one pooling request (vllm/pooling), all checked before any is queued
(serving_pooling_base.py). ``encoding_format`` "float" returns lists of floats, "base64"
the float32 little-endian bytes in base64 (what OpenAI's clients decode). ``dimensions``
cuts a Matryoshka model's embeddings; other models refuse it. ``truncate_prompt_tokens``
keeps each input's last k tokens (-1: the last ``max_model_len``, as for completions; k
above ``max_model_len`` is a 400). A generative engine answers 400, as an embedding engine
does to /v1/completions and /v1/chat/completions. ``normalize`` false returns the raw
pooled vector, true the unit one (None: the pooler config's). Chat ``messages`` may be
sent instead of ``input`` (upstream's chat embeddings; serving_pooling_base.py).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import Request

from vllm.entrypoints.openai.protocol import ChatMessage, OpenAIBaseModel, OpenAIRequest, UsageInfo
from vllm.entrypoints.openai.serving_pooling_base import PoolingServing, prompt_usage, vector_json


class EmbeddingRequest(OpenAIRequest):
    model: str | None = None
    # exactly one of input and messages (a chat rendered with the chat template)
    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None  # None: the pooler config's
    # None: true for input texts, false for messages (upstream's defaults)
    add_special_tokens: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    # The base of the response id and engine ids (the X-Request-Id header wins).
    request_id: str | None = None


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


class OpenAIServingEmbedding(PoolingServing):
    """Handler of /v1/embeddings."""

    async def create_embedding(self, req: EmbeddingRequest, raw: Request | None):
        """Returns an EmbeddingResponse, or None when the client went away.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        pooled = await self.pooled_inputs(req, raw, "Embeddings", "embd")
        if pooled is None:
            return None
        base, inputs, vecs = pooled
        data = [
            EmbeddingData(index=i, embedding=vector_json(v, req.encoding_format))
            for i, v in enumerate(vecs)
        ]
        return EmbeddingResponse(id=base, created=int(time.time()), model=self.model_for(req),
                                 data=data, usage=prompt_usage(inputs))  # fmt: skip
