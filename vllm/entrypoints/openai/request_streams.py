"""Reading a request's outputs in a handler: the final output of a non-streamed request
(watching for a client that goes away), and several prompts' streams interleaved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request

from vllm.outputs import RequestOutput


async def collect_final(
    gen: AsyncIterator[RequestOutput], raw_request: Request | None
) -> RequestOutput | None:
    """Drain ``gen`` and return its last output; None when the client went away (the
    generator is closed, which aborts the request)."""

    async def drain():
        last = None
        async for out in gen:
            last = out
        return last

    task = asyncio.ensure_future(drain())
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        if raw_request is not None and await raw_request.is_disconnected():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await gen.aclose()
            return None


async def merge(gens: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """Interleave several async iterators, yielding (index, item) as items arrive.

    One iterator (a request with one prompt, the usual case) is read directly: no pump
    task and no queue between it and the caller, which saves a task switch and two queue
    operations per streamed token. Leaving early closes the iterators either way (for a
    request stream, that aborts the request)."""
    if len(gens) == 1:
        (gen,) = gens
        try:
            async for item in gen:
                yield 0, item
        finally:
            aclose = getattr(gen, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, g):
        try:
            async for item in g:
                await queue.put((i, item))
            await queue.put((i, done))
        except BaseException as e:  # forwarded to the consumer
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        # Cancelling a pump closes its generator, which aborts its request.
        await asyncio.gather(*tasks, return_exceptions=True)
