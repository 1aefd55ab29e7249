"""The server's pooling routes, for an engine started with ``--task embed`` (a generative
engine answers each with a 400 naming the API):

- ``POST /v1/embeddings``: OpenAI's Embeddings API (serving_embedding.py);
- ``POST /pooling``: upstream's Pooling API, the same inputs (serving_pooling.py);
- ``POST /score``, ``/v1/score``: cosine similarity of text pairs (serving_score.py);
- ``POST /rerank``, ``/v1/rerank``, ``/v2/rerank``: documents ranked by their cosine
  similarity to a query (Jina's and Cohere's shape; serving_score.py).

A client that goes away gets its requests aborted and a 499.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from vllm.entrypoints.openai.api_errors import to_api_error
from vllm.entrypoints.openai.serving_embedding import EmbeddingRequest, OpenAIServingEmbedding
from vllm.entrypoints.openai.serving_pooling import OpenAIServingPooling, PoolingRequest
from vllm.entrypoints.openai.serving_score import (
    OpenAIServingScores,
    RerankRequest,
    ScoreRequest,
)


def add_pooling_routes(app: FastAPI, handler_args: tuple, handler_kwargs: dict, chat=None):
    """Register the pooling routes on ``app``; each handler is built with
    ``(*handler_args, **handler_kwargs)``, the OpenAIServing arguments of the server's
    other handlers (engine, served names, tokenizer thread, LoRA map, ...). ``chat``, the
    server's chat handler, renders the ``messages`` of /v1/embeddings and /pooling.

    Returns:
        The /v1/embeddings route, ``async (EmbeddingRequest, Request) -> Response``
        (/invocations answers an embedding engine's requests with it).
    """
    embedding = OpenAIServingEmbedding(*handler_args, chat=chat, **handler_kwargs)
    pooling = OpenAIServingPooling(*handler_args, chat=chat, **handler_kwargs)
    scores = OpenAIServingScores(*handler_args, **handler_kwargs)

    async def answer(call, body, raw: Request):
        try:
            result = await call(body, raw)
        except Exception as e:
            return to_api_error(e).response()
        if result is None:  # the client went away; its requests were aborted
            return Response(status_code=499)
        return JSONResponse(result.model_dump())

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, raw: Request):
        return await answer(embedding.create_embedding, body, raw)

    @app.post("/pooling")
    async def create_pooling(body: PoolingRequest, raw: Request):
        return await answer(pooling.create_pooling, body, raw)

    @app.post("/score")
    @app.post("/v1/score")
    async def create_score(body: ScoreRequest, raw: Request):
        return await answer(scores.create_score, body, raw)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def do_rerank(body: RerankRequest, raw: Request):
        return await answer(scores.do_rerank, body, raw)

    return embeddings
