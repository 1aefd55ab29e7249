"""What the pooling APIs share (/v1/embeddings, /pooling, /score, /rerank; see
vllm/pooling): refusing a generative engine, the pooling params, each input's token ids
(truncated, checked against the context and the scheduler before anything is queued), one
pooling request per input, and a vector's JSON form.

An embeddings or pooling request gives either ``input`` or chat ``messages`` (upstream's
chat embeddings): the messages are rendered with the chat template as
/v1/chat/completions renders them (the server's chat handler does it; the request's
``chat_template``, ``chat_template_kwargs``, ``add_generation_prompt`` default false,
``continue_final_message``) and the rendered prompt is one input. ``add_special_tokens``
defaults to true for ``input`` texts and to false for ``messages`` (the template writes
its own), as upstream. ``normalize`` (None: the pooler config's) is the PoolingParams'.

Each input becomes one pooling request; the requests of one API call run concurrently and
are all aborted when the client goes away. ``truncate_prompt_tokens`` keeps each input's
last k tokens (-1: the last ``max_model_len``, as for completions; k above
``max_model_len`` is a 400).
"""

from __future__ import annotations

import asyncio
import base64

import torch
from fastapi import Request

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import UsageInfo
from vllm.entrypoints.openai.request_streams import collect_final
from vllm.entrypoints.openai.serving_engine import OpenAIServing, base_request_id
from vllm.pooling_params import PoolingParams


class PoolingServing(OpenAIServing):
    """Base of the pooling handlers (embeddings, pooling, score and rerank).

    Args:
        chat: the server's chat handler, which renders ``messages`` inputs; None: such
            inputs are refused.
        Others: as :class:`OpenAIServing`.
    """

    def __init__(self, *args, chat=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.chat = chat

    def check_pooling_model(self, api: str, why: str = "") -> None:
        """Raises APIError 400 (param ``model``) on a generative engine, naming ``api``
        and the flag that serves it; ``why`` is added to the message."""
        if self.engine.pooler_config is None:
            raise APIError(
                f"The model does not support the {api} API (serve it with --task embed){why}.",
                400,
                "model",
            )

    def pooling_params(
        self, dimensions: int | None = None, normalize: bool | None = None
    ) -> PoolingParams:
        """PoolingParams of a request, checked against the model.

        Raises:
            APIError 400 naming ``dimensions``: not a positive integer, or a size the
                model cannot give (not Matryoshka, above the hidden size, not listed).
        """
        try:
            params = PoolingParams(dimensions=dimensions, normalize=normalize)
            self.engine.check_pooling_params(params)
        except ValueError as e:
            raise APIError(str(e), 400, "dimensions") from None
        return params

    async def input_ids(
        self, items: list, field: str, keep: int | None, add_special_tokens: bool = True
    ) -> list[list[int]]:
        """Token ids of each input (a text or a list of ids), cut to its last ``keep``
        tokens (None: all; see :meth:`kept_tokens`).

        Raises:
            APIError 400 naming ``field``: no inputs, an empty or bad input (see
                :meth:`item_ids`), or one :meth:`check_fits` refuses.
        """
        if not items:
            raise APIError(f"{field} must not be empty.", 400, field)
        out = []
        for item in items:
            ids = await self.item_ids(item, field, keep is None, add_special_tokens)
            if keep is not None:
                ids = ids[-keep:]
            self.check_fits(ids, field)
            out.append(ids)
        return out

    async def message_ids(self, req) -> list[int]:
        """Token ids of ``req.messages`` rendered with the chat template (see the module
        docstring), cut to the last ``truncate_prompt_tokens``.

        Raises:
            APIError 400: no chat handler, anything /v1/chat/completions refuses in the
                messages or the template options, or a prompt :meth:`check_fits` refuses.
        """
        if self.chat is None:
            raise APIError("messages inputs are not served by this endpoint.", 400, "messages")
        add_special = bool(req.add_special_tokens)  # None: false for messages, as upstream
        ids = await self.chat.message_ids(
            req, add_special, truncate_prompt_tokens=req.truncate_prompt_tokens
        )
        self.check_fits(ids, "messages")
        return ids

    def check_fits(self, ids: list[int], field: str) -> None:
        """Raises APIError 400 naming ``field`` for an input without tokens (``messages``
        a template rendered to nothing, say), above ``max_model_len``, or one the
        scheduler could never run."""
        if not ids:
            raise APIError(f"{field} gives no tokens: there is nothing to pool.", 400, field)
        if len(ids) > self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {len(ids)} tokens in the {field} for embedding "
                f"generation. Please reduce the length of the {field}.",
                400,
                field,
            )
        self.check_schedulable(len(ids), 1, param=field)

    async def pooled_inputs(self, req, raw: Request | None, api: str, prefix: str):
        """Check ``req`` (an EmbeddingRequest's fields) and pool each of its inputs (or its
        rendered ``messages``): ``(request id, token ids per input, vectors)``, each vector
        a float32 CPU tensor [hidden] (or [dimensions]); None when the client went away.

        Raises:
            APIError: 400 / 404 with the OpenAI error body (``api`` names the API a
                generative engine does not serve; both or neither of input and messages).
        """
        self.check_model(req.model)
        self.check_pooling_model(api)
        if (req.input is None) == (req.messages is None):
            got = "both" if req.input is not None else "neither"
            raise APIError(f"give exactly one of input and messages (got {got}).", 400, "input")
        params = self.pooling_params(req.dimensions, req.normalize)
        keep = self.kept_tokens(req)
        if req.messages is not None:
            inputs = [await self.message_ids(req)]
        else:
            add_special = req.add_special_tokens is not False  # None: true, as upstream
            inputs = await self.input_ids(as_items(req.input), "input", keep, add_special)
        base = f"{prefix}-{base_request_id(raw, getattr(req, 'request_id', None))}"
        vecs = await self.pool(inputs, params, base, req, raw)
        return None if vecs is None else (base, inputs, vecs)

    async def pool(
        self, inputs: list[list[int]], params: PoolingParams, base_id: str, req, raw: Request | None
    ) -> list[torch.Tensor] | None:
        """Pool each input (one request ``{base_id}-{i}`` each, suffixed when that id is in
        flight already, with the request's LoRA adapter and priority) and return the
        vectors in input order, each a float32 CPU tensor [hidden] (or [dimensions]); None
        when the client went away (every request is aborted then).

        Raises:
            APIError 400: a priority the scheduling policy refuses, or a request the
                engine refused.
        """
        lora = self.lora_for(req)
        priority = getattr(req, "priority", 0)
        self.check_priority(priority)
        gens = [
            self.engine.encode(
                {"prompt_token_ids": ids},
                params,
                f"{base_id}-{i}",
                lora,
                priority,
                dedupe_request_id=True,
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
        return [o.outputs.data for o in outs]


def vector_json(vec: torch.Tensor, encoding_format: str) -> list[float] | str:
    """A pooled vector [n] as a response carries it: a list of floats ("float") or its
    float32 little-endian bytes in base64 ("base64", what OpenAI's clients decode)."""
    arr = vec.numpy().astype("<f4")  # [n]
    if encoding_format == "float":
        return arr.tolist()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def prompt_usage(inputs: list[list[int]]) -> UsageInfo:
    """Usage of a pooling call: every input's tokens are prompt tokens; completion_tokens
    0, as upstream sends it (clients that add usages need a number)."""
    n = sum(len(ids) for ids in inputs)
    return UsageInfo(prompt_tokens=n, total_tokens=n, completion_tokens=0)


def as_items(value: str | list) -> list:
    """A request's input as a list of inputs: a text or one list of token ids is one input;
    a list of texts or of id lists is several."""
    if isinstance(value, str) or (value and all(isinstance(t, int) for t in value)):
        return [value]
    return list(value)
