"""Beam search on the :class:`~vllm.engine.async_llm_engine.AsyncLLMEngine` (the server's
``use_beam_search``): the rules of vllm/beam_search.py, with each step's beams sent to the
engine as concurrent one-token requests, so other clients' requests share its steps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from vllm.beam_search import BeamSearch, to_request_output
from vllm.outputs import RequestOutput
from vllm.sampling_params import BeamSearchParams


async def beam_search(
    engine,
    prompt: dict,
    params: BeamSearchParams,
    request_id: str,
    lora_request=None,
    dedupe_request_id: bool = False,
) -> AsyncIterator[RequestOutput]:
    """Yield one finished RequestOutput with ``params.beam_width`` outputs, best first.

    Args:
        engine: the AsyncLLMEngine.
        prompt: ``{"prompt_token_ids": [...], "prompt": text (optional), "cache_salt":
            salt (optional, passed to every step's requests)}``.
        params: the search's parameters.
        request_id: the id of the search; its steps' requests are ``<id>-s<step>-<beam>``.
        lora_request: the LoRA adapter every step's requests run with (None: the base model).
        dedupe_request_id: a step request whose id is in use runs under a suffixed id
            (see ``AsyncLLMEngine.generate``).
    Raises:
        ValueError: ``2 x beam_width`` above max_logprobs.
        EngineDeadError / RequestFailedError: as :meth:`AsyncLLMEngine.generate`.
    """
    ids = list(prompt["prompt_token_ids"])
    search = BeamSearch.for_engine(engine.engine, [ids], params)
    step_params = params.step_params()
    salt = {k: prompt[k] for k in ("cache_salt",) if prompt.get(k) is not None}

    async def one(tokens: list[int], rid: str) -> RequestOutput:
        last = None
        async for out in engine.generate(
            {"prompt_token_ids": tokens, **salt}, step_params, rid, lora_request=lora_request,
            dedupe_request_id=dedupe_request_id,
        ):  # fmt: skip
            last = out
        return last

    step = 0
    while not search.done:
        pending = search.pending()
        outs = await asyncio.gather(*(one(t, f"{request_id}-s{step}-{j}") for _, j, t in pending))
        search.advance({(i, j): o.outputs[0].logprobs[0] for (i, j, _), o in zip(pending, outs)})
        step += 1
    result = search.outputs(engine.tokenizer)[0]
    yield to_request_output(request_id, prompt.get("prompt"), ids, result)
