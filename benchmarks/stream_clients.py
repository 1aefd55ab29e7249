"""HTTP clients for the serving benchmarks: one httpx connection per concurrent stream.

One ``httpx.AsyncClient`` shared by 64 concurrent streams spends its time in its
connection pool: httpcore looks over every pooled connection for each request and each
response event, so with dozens of open streams the client process itself becomes the
bottleneck (in a profiled 64-stream run on a 2-core machine, about 1.5 million idle-checks
and seconds of pool bookkeeping) and every token's arrival time is measured late. A pool
of single-connection clients, one lent to each stream at a time, keeps that bookkeeping
constant per stream, so the measured TTFT and inter-token gaps are the server's. The
clients share one SSL context: httpx builds a new one per client otherwise (about 60 ms
each, on the event loop, while other streams wait).

Used by benchmark_serving.py, benchmark_prefix_caching.py and benchmark_chunked_prefill.py
(scripts in this folder; this module is imported by its bare name).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import httpx


class StreamClients:
    """Up to ``size`` single-connection ``httpx.AsyncClient`` objects, made on demand.

    Use ``async with StreamClients(n) as pool:`` and, per request, ``async with
    pool.client() as c:``; a client goes back to the pool when the block ends (its
    connection stays open for the next request). More than ``size`` requests at once wait
    for a client.

    Args:
        size: the most clients (the benchmark's concurrency), at least 1.
    Raises:
        ValueError: ``size`` below 1.
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"StreamClients needs size >= 1, got {size}.")
        self.size = size
        self._all: list[httpx.AsyncClient] = []
        self._idle: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        self._ssl = ssl.create_default_context()

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        """Lend one client for one request (a new one while fewer than ``size`` exist)."""
        if self._idle.empty() and len(self._all) < self.size:
            limits = httpx.Limits(max_connections=1)
            c = httpx.AsyncClient(timeout=None, limits=limits, verify=self._ssl)
            self._all.append(c)
        else:
            c = await self._idle.get()
        try:
            yield c
        finally:
            self._idle.put_nowait(c)

    async def __aenter__(self) -> StreamClients:
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all))
        self._all.clear()
