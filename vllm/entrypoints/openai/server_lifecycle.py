"""How the OpenAI server stops: SIGINT/SIGTERM drain the requests in flight for
``--shutdown-timeout`` seconds, then abort what is left; a second signal aborts them at
once (each stream still ends with finish_reason "abort" and ``[DONE]``), a third exits
without waiting; a dead engine makes the server exit with status 1 (see the api_server
module docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading

from vllm.engine.async_llm_engine import AsyncLLMEngine

logger = logging.getLogger("vllm.entrypoints.openai.api_server")

# Seconds uvicorn still waits after --shutdown-timeout, once the remaining requests were
# aborted, for their final chunks to be written.
ABORT_GRACE_S = 2.0
# Seconds /health keeps answering 503 after the engine died before the server stops, so a
# monitor polling it sees the failure (the exit status then tells the supervisor).
_DEAD_EXIT_DELAY_S = 2.0


def graceful_server_class() -> type:
    """The uvicorn.Server subclass ``run_server`` uses (built on call, so uvicorn is only
    imported when a server starts)."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn.Server whose SIGINT/SIGTERM only start the graceful exit (uvicorn would
        re-raise the signal after serving, so the process would not exit with 0), and whose
        shutdown aborts the requests still running after ``drain_timeout`` seconds.

        Args:
            config: uvicorn's config.
            engine: aborted with :meth:`AsyncLLMEngine.abort_all` at the drain timeout.
            drain_timeout: seconds the requests in flight may take to finish.
        """

        def __init__(self, config, engine: AsyncLLMEngine, drain_timeout: float):
            super().__init__(config)
            self.engine, self.drain_timeout = engine, drain_timeout
            self.exit_code = 0
            self._signals = 0
            self._loop: asyncio.AbstractEventLoop | None = None

        def handle_exit(self, sig, frame) -> None:
            """First SIGINT/SIGTERM: start the graceful exit and say what it waits for.
            Second: abort the requests still running now (their streams end normally).
            Third: uvicorn's forced exit. (A signal handler: the log line and the abort
            are scheduled on the event loop.)"""
            self._signals += 1
            if self._signals == 1:
                self.should_exit = True
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(self._log_draining)
            elif self._signals == 2 and self._loop is not None:
                self._loop.call_soon_threadsafe(self._abort_now)
            else:
                self.force_exit = True

        def _log_draining(self) -> None:
            logger.info(
                "Shutting down: waiting up to %.0f s (--shutdown-timeout) for %d request(s) "
                "to finish; interrupt again to abort them now.",
                self.drain_timeout,
                self.engine.num_open_requests,
            )

        def _abort_now(self) -> None:
            asyncio.ensure_future(self.engine.abort_all("the server was interrupted a second time"))

        def engine_died(self, err: BaseException) -> None:
            """Called on the event loop once the engine is dead: /health answers 503 for
            a moment, then the server stops and exits with status 1."""
            logger.error(
                "The engine died (%s); the server stops in %.0f s with exit status 1.",
                err,
                _DEAD_EXIT_DELAY_S,
            )
            self.exit_code = 1
            asyncio.get_running_loop().call_later(
                _DEAD_EXIT_DELAY_S, lambda: setattr(self, "should_exit", True)
            )

        async def shutdown(self, sockets=None):
            async def abort_late():
                await asyncio.sleep(self.drain_timeout)
                await self.engine.abort_all(
                    f"the server is shutting down and --shutdown-timeout={self.drain_timeout} "
                    "s has passed"
                )

            late = asyncio.ensure_future(abort_late())
            try:
                await super().shutdown(sockets)
            finally:
                late.cancel()
                await asyncio.gather(late, return_exceptions=True)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            self._loop = asyncio.get_running_loop()
            sigs = (signal.SIGINT, signal.SIGTERM)
            saved = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
            try:
                yield
            finally:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)

    return GracefulServer
