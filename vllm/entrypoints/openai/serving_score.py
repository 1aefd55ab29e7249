"""/score, /v1/score and /rerank, /v1/rerank, /v2/rerank (upstream's Score and Re-rank APIs)
for embedding models (``--task embed``): a pair's score is the cosine similarity of its
two texts' embeddings (vllm/pooling/scoring.py, which also states the pairing rules).
Cross-encoder models (upstream's ``--task score``) are not served; a generative engine
answers 400 saying so.

Score: ``text_1`` and ``text_2``, each a text or a list of texts (1-to-1, 1-to-N, N-to-N);
``data[i].score`` is pair i's. Rerank (Jina's and Cohere's shape): one ``query`` and its
``documents``; ``results`` holds the ``top_n`` best (0, the default: all) sorted by
``relevance_score``, highest first, each with its ``index`` among the documents and the
``document`` text. Both take ``truncate_prompt_tokens`` (each text's last k tokens),
``priority`` and ``request_id`` (the base of the response id, as the X-Request-Id
header). Every text is embedded once and its tokens counted once in ``usage``.
"""

from __future__ import annotations

import time

from fastapi import Request
from pydantic import BaseModel

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import OpenAIBaseModel, OpenAIRequest, UsageInfo
from vllm.entrypoints.openai.serving_engine import base_request_id
from vllm.entrypoints.openai.serving_pooling_base import PoolingServing, prompt_usage
from vllm.pooling.scoring import PairingError, check_pairs, cosine_scores

_NOT_CROSS_ENCODERS = (
    "; scores are the cosine similarity of an embedding model's vectors, and cross-encoder "
    "models (upstream's --task score) are not served"
)


class ScoreRequest(OpenAIRequest):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    request_id: str | None = None  # the base of the response id (X-Request-Id wins)


class ScoreData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankRequest(OpenAIRequest):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int = 0
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    request_id: str | None = None  # the base of the response id (X-Request-Id wins)


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class OpenAIServingScores(PoolingServing):
    """Handler of /score and /rerank (and their /v1, /v2 aliases)."""

    async def _scores(self, req, first: list[str], second: list[str], names, api, prefix, raw):
        """Check the request, embed every text once and score the pairs (module
        docstring): ``(request id, one score per pair, prompt tokens)``; None when the
        client went away.

        Raises:
            APIError: 400 naming the field at fault (see PoolingServing.input_ids and
                vllm/pooling/scoring.py), 404 for an unknown model.
        """
        self.check_model(req.model)
        self.check_pooling_model(api, _NOT_CROSS_ENCODERS)
        try:
            check_pairs(first, second, names)
        except PairingError as e:
            raise APIError(str(e), 400, e.param) from None
        keep = self.kept_tokens(req)
        ids_1 = await self.input_ids(first, names[0], keep)
        ids_2 = await self.input_ids(second, names[1], keep)
        base = f"{prefix}-{base_request_id(raw, req.request_id)}"
        vecs = await self.pool(ids_1 + ids_2, self.pooling_params(), base, req, raw)
        if vecs is None:
            return None
        scores = cosine_scores(vecs[: len(ids_1)], vecs[len(ids_1) :])
        return base, scores, prompt_usage(ids_1 + ids_2)

    async def create_score(self, req: ScoreRequest, raw: Request | None):
        """Returns a ScoreResponse (``data[i]`` for pair i), or None when the client went
        away.

        Raises:
            APIError: 400 / 404 with the OpenAI error body.
        """
        first = [req.text_1] if isinstance(req.text_1, str) else req.text_1
        second = [req.text_2] if isinstance(req.text_2, str) else req.text_2
        scored = await self._scores(req, first, second, ("text_1", "text_2"), "Score", "score",
                                    raw)  # fmt: skip
        if scored is None:
            return None
        base, scores, usage = scored
        data = [ScoreData(index=i, score=s) for i, s in enumerate(scores)]
        return ScoreResponse(id=base, created=int(time.time()), model=self.model_for(req),
                             data=data, usage=usage)  # fmt: skip

    async def do_rerank(self, req: RerankRequest, raw: Request | None):
        """Returns a RerankResponse (the ``top_n`` best documents, highest score first),
        or None when the client went away.

        Raises:
            APIError: 400 (``top_n`` below 0 too) / 404 with the OpenAI error body.
        """
        if req.top_n < 0:
            raise APIError(f"top_n must be >= 0 (0: every document), got {req.top_n}.", 400,
                           "top_n")  # fmt: skip
        scored = await self._scores(req, [req.query], req.documents, ("query", "documents"),
                                    "Re-rank", "rerank", raw)  # fmt: skip
        if scored is None:
            return None
        base, scores, usage = scored
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable on ties
        results = [
            RerankResult(
                index=i, document=RerankDocument(text=req.documents[i]), relevance_score=scores[i]
            )  # fmt: skip
            for i in order[: req.top_n or len(order)]
        ]
        return RerankResponse(id=base, model=self.model_for(req), results=results,
                              usage=RerankUsage(prompt_tokens=usage.prompt_tokens,
                                                total_tokens=usage.total_tokens))  # fmt: skip
