"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) around an AsyncLLMEngine.

Endpoints: /v1/models, /v1/completions, /v1/chat/completions, /v1/responses
(serving_responses.py), /tokenize, /detokenize
(serving_tokenization.py), the pooling APIs of an embedding engine (pooling_routes.py),
/invocations (SageMaker's route: chat or completion by the body, embeddings on an
embedding engine), /health (and its alias
/ping), /version, /metrics (Prometheus text, this server's own
registry), POST /start_profile and /stop_profile (only with VLLM_TORCH_PROFILER_DIR set),
POST /reset_prefix_cache (only with VLLM_SERVER_DEV_MODE=1).
Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for bad
requests (malformed JSON, pydantic validation errors and ValueErrors included), 401 for a
missing or wrong key when ``--api-key`` is set, 404 for an unknown model, 413 for a body
above ``--max-request-body-bytes``, 500 when a request fails in the engine, 503 once the
engine is dead.

Shutdown: SIGINT/SIGTERM start a graceful exit: the server stops accepting and the requests
in flight may finish for ``--shutdown-timeout`` seconds; those still running then are
aborted (streams get a final chunk with finish_reason "abort" and ``[DONE]``, other
requests a 503 naming the shutdown), then the app's lifespan stops the engine
(``AsyncLLMEngine.shutdown`` -> ``LLMEngine.shutdown``) and the process exits with 0. A
second signal aborts the requests at once; a third exits without waiting
(server_lifecycle.py).

Engine death: when the engine loop dies (e.g. a pipeline worker process was killed),
/health answers 503, the requests in flight fail, and the server exits with status 1 so
that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import socket
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm import envs
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.default_model import resolve_model, served_model_names
from vllm.engine.metrics import EngineMetrics
from vllm.entrypoints.chat_utils import check_default_template_kwargs, load_chat_template
from vllm.entrypoints.openai.api_errors import APIError, set_log_error_stack, to_api_error
from vllm.entrypoints.openai.lora_modules import lora_requests
from vllm.entrypoints.openai.lora_routes import add_lora_routes
from vllm.entrypoints.openai.pooling_routes import add_pooling_routes
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from vllm.entrypoints.openai.request_guards import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    ApiKeyAuth,
    BodySizeLimit,
    LoadCounter,
    LoadTracker,
    RequestIdHeader,
    validation_message,
)
from vllm.entrypoints.openai.responses_input import ResponsesRequest
from vllm.entrypoints.openai.server_lifecycle import ABORT_GRACE_S, graceful_server_class
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_embedding import EmbeddingRequest
from vllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from vllm.entrypoints.openai.serving_tokenization import (
    DetokenizeRequest,
    OpenAIServingTokenization,
    TokenizeRequest,
)
from vllm.entrypoints.openai.tool_parsers import (
    ToolParser,
    get_tool_parser,
    load_tool_parser_plugin,
    tool_parser_names,
)
from vllm.logger import configure_command_logging
from vllm.lora.request import LoRARequest
from vllm.reasoning import ReasoningParser, get_reasoning_parser
from vllm.version import __version__

logger = logging.getLogger("vllm.entrypoints.openai.api_server")


@dataclass(frozen=True)
class CorsOptions:
    """What browsers on other origins may do (``--allowed-origins``, ``--allowed-methods``,
    ``--allowed-headers``, ``--allow-credentials``; upstream's defaults)."""

    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


def build_app(
    engine: AsyncLLMEngine,
    served_model_names: list[str],
    api_key: str | None,
    max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
    chat_template: str | None = None,
    tool_parser: ToolParser | None = None,
    *,
    cors: CorsOptions | None = None,
    root_path: str | None = None,
    response_role: str = "assistant",
    return_tokens_as_token_ids: bool = False,
    enable_prompt_tokens_details: bool = False,
    lora_modules: list[LoRARequest] | None = None,
    enable_request_id_headers: bool = False,
    disable_fastapi_docs: bool = False,
    chat_template_content_format: str = "auto",
    reasoning_parser: ReasoningParser | None = None,
    enable_force_include_usage: bool = False,
    enable_server_load_tracking: bool = False,
    middleware: list | None = None,
    exclude_tools_when_tool_choice_none: bool = False,
    default_chat_template_kwargs: dict | None = None,
    log_error_stack: bool = False,
):
    """The FastAPI app serving ``engine`` (the engine loop starts with the app).

    Args:
        max_request_body_bytes: bodies above this get 413 (None: no limit).
        chat_template: template text for chat requests (None: the tokenizer's own).
        tool_parser: the parser of chat tool_choice "auto" (None: "auto" is refused).
        cors: the CORS policy (None: upstream's defaults, every origin without
            credentials). It is the outermost layer, so preflight requests are answered
            before the API key is checked, and error responses carry the CORS headers too.
        root_path: the URL prefix a reverse proxy serves the app under; routes match with
            and without it.
        response_role: ``--response-role``: the role of chat replies to a generation
            prompt (default "assistant").
        return_tokens_as_token_ids: render every logprobs token as "token_id:ID".
        enable_prompt_tokens_details: report usage.prompt_tokens_details.cached_tokens.
        lora_modules: LoRA adapters served under their ``lora_name`` (checked already);
            with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 more are added and removed at run time
            (vllm/entrypoints/openai/lora_routes.py).
        enable_request_id_headers: every response carries ``X-Request-Id`` (the request's
            own, else a fresh one that also names the request in the engine, see
            :class:`RequestIdHeader`). Without it a request's ``X-Request-Id`` still
            names it: ids are ``chatcmpl-<id>`` / ``cmpl-<id>`` / ``embd-<id>``
            (serving_engine.py ``base_request_id``).
        disable_fastapi_docs: no /docs, /redoc or /openapi.json.
        chat_template_content_format: ``auto``, ``string`` or ``openai``
            (``--chat-template-content-format``, vllm/entrypoints/chat_utils.py).
        reasoning_parser: ``--reasoning-parser``: chat replies' reasoning goes to
            ``reasoning`` (vllm/reasoning); None: replies are all content.
        enable_force_include_usage: every completion and chat stream ends with a usage
            chunk (``--enable-force-include-usage``).
        enable_server_load_tracking: ``GET /load`` reports the API requests in flight
            (:class:`~vllm.entrypoints.openai.request_guards.LoadTracker`); without it, 0.
        middleware: ``--middleware`` objects (see :func:`load_middleware`), added in
            order inside CORS and outside the API key check.
        exclude_tools_when_tool_choice_none / default_chat_template_kwargs: the flags of
            those names (see :class:`OpenAIServingChat`).
        log_error_stack: ``--log-error-stack``: every error response made from an
            exception logs its traceback (:func:`~vllm.entrypoints.openai.api_errors.
            set_log_error_stack`; one setting per process, the last app built sets it).
    """
    set_log_error_stack(log_error_stack)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        logger.info("Shutting down the engine.")
        await engine.shutdown()
        tokenize_pool.shutdown(wait=False)

    docs = (
        {"docs_url": None, "redoc_url": None, "openapi_url": None} if disable_fastapi_docs else {}
    )
    app = FastAPI(lifespan=lifespan, **docs)
    # set after construction, as upstream does: FastAPI's root_path argument is deprecated
    # (a FastAPIDeprecationWarning in every start-up log), the attribute is what it reads
    app.root_path = root_path or ""
    tokenize_pool = ThreadPoolExecutor(1, "vllm-tokenize")
    loras = {lora.lora_name: lora for lora in lora_modules or ()}  # shared, see lora_routes
    if envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
        add_lora_routes(app, engine, loras, served_model_names)
    as_ids = dict(
        return_tokens_as_token_ids=return_tokens_as_token_ids,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        loras=loras,
        enable_force_include_usage=enable_force_include_usage,
        reasoning_token_ids=reasoning_gate(engine, reasoning_parser),
    )
    completion = OpenAIServingCompletion(engine, served_model_names, tokenize_pool, **as_ids)
    chat = OpenAIServingChat(
        engine,
        served_model_names,
        tokenize_pool,
        chat_template=chat_template,
        tool_parser=tool_parser,
        response_role=response_role,
        content_format=chat_template_content_format,
        reasoning_parser=reasoning_parser,
        exclude_tools_when_tool_choice_none=exclude_tools_when_tool_choice_none,
        default_chat_template_kwargs=default_chat_template_kwargs,
        **as_ids,
    )
    tokenization = OpenAIServingTokenization(chat)
    if max_request_body_bytes is not None:
        app.add_middleware(BodySizeLimit, limit=max_request_body_bytes)
    load = LoadCounter()  # stays 0 without tracking
    if enable_server_load_tracking:
        app.add_middleware(LoadTracker, counter=load)

    if api_key:
        app.add_middleware(ApiKeyAuth, api_key=api_key)
    if enable_request_id_headers:
        app.add_middleware(RequestIdHeader)
    for obj in middleware or ():
        if inspect.isclass(obj):
            app.add_middleware(obj)
        else:
            app.middleware("http")(obj)
    cors = cors or CorsOptions()
    app.add_middleware(  # added last: the outermost layer
        CORSMiddleware,
        allow_origins=list(cors.allowed_origins),
        allow_methods=list(cors.allowed_methods),
        allow_headers=list(cors.allowed_headers),
        allow_credentials=cors.allow_credentials,
    )

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
    @app.get("/ping")  # upstream's SageMaker-style alias, GET and POST (one route each,
    @app.post("/ping")  # so the OpenAPI schema has distinct operation ids)
    async def health():
        try:
            await engine.check_health()
        except Exception as e:
            return APIError(str(e), 503).response()
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/load")
    async def server_load():
        return {"server_load": load.value}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    if envs.VLLM_TORCH_PROFILER_DIR:  # as upstream: the routes exist only then

        @app.post("/start_profile")
        async def start_profile():
            return await _profile(engine.start_profile)

        @app.post("/stop_profile")
        async def stop_profile():
            return await _profile(engine.stop_profile)

        async def _profile(call):
            try:
                await call()
            except RuntimeError as e:  # already running / none running: the caller's order
                return APIError(str(e), 400).response()
            return Response(status_code=200)

    if envs.VLLM_SERVER_DEV_MODE:  # as upstream: development routes exist only then
        logger.warning(
            "VLLM_SERVER_DEV_MODE is set: POST /reset_prefix_cache is open to every client; "
            "do not use this in production."
        )

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
        cards += [
            ModelCard(
                id=lora.lora_name,
                root=lora.lora_path,
                max_model_len=engine.max_model_len,
                parent=lora.base_model_name or served_model_names[0],
            )  # fmt: skip
            for lora in list(loras.values())
        ]
        return ModelList(data=cards)

    async def answer(result):
        if result is None:  # the client went away; its requests were aborted
            return Response(status_code=499)
        if hasattr(result, "__aiter__"):
            # A stream's status is sent before its first event: a dead (or stopping) engine
            # is a 503 now, not a 200 whose only event is the error (as upstream checks).
            try:
                await engine.check_health()
            except BaseException:
                if hasattr(result, "aclose"):
                    await result.aclose()
                raise
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(result if isinstance(result, dict) else result.model_dump())

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        try:
            return JSONResponse((await tokenization.tokenize(body)).model_dump())
        except Exception as e:
            return to_api_error(e).response()

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        try:
            return JSONResponse((await tokenization.detokenize(body)).model_dump())
        except Exception as e:
            return to_api_error(e).response()

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

    responses = OpenAIServingResponses(chat)

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, raw: Request):
        try:
            return await answer(await responses.create_response(body, raw))
        except Exception as e:
            return to_api_error(e).response()

    embeddings = add_pooling_routes(app, (engine, served_model_names, tokenize_pool), as_ids,
                                    chat)  # fmt: skip

    @app.post("/invocations")
    async def invocations(raw: Request):
        """SageMaker's inference route (as upstream): a body with ``messages`` is a chat
        completion, one with ``prompt`` a completion; on an embedding engine every body is
        an embeddings request (``input`` or chat ``messages``). The answer is that
        route's."""
        try:
            body = await raw.json()
        except ValueError as e:
            return APIError(f"The request body is not valid JSON: {e}.", 400).response()
        if engine.pooler_config is not None:
            model, route = EmbeddingRequest, embeddings
        else:
            kind = next(
                (k for k in ("messages", "prompt") if isinstance(body, dict) and k in body), None
            )
            if kind is None:
                return APIError(
                    "/invocations needs a JSON object with `messages` (a chat completion) or "
                    "`prompt` (a completion).", 400,
                ).response()  # fmt: skip
            model = ChatCompletionRequest if kind == "messages" else CompletionRequest
            route = chat_completions if kind == "messages" else completions
        try:
            req = model.model_validate(body)
        except ValidationError as e:
            errs = [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
            msg, param = validation_message(errs)
            return APIError(msg, 400, param).response()
        return await route(req, raw)

    return app


def load_middleware(path: str):
    """The object ``--middleware PATH`` names (``package.module.Name``): an ASGI middleware
    class, or an async function ``(request, call_next)``, as upstream's flag.

    Raises:
        ValueError: the path cannot be imported, or names something else.
    """
    module_path, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"--middleware {path!r} cannot be imported: {e}") from None
    if not (inspect.isclass(obj) or inspect.iscoroutinefunction(obj)):
        raise ValueError(
            f"--middleware {path!r} is a {type(obj).__name__}: it must be an ASGI middleware "
            "class or an async function (request, call_next)."
        )
    return obj


def reasoning_gate(engine: AsyncLLMEngine, parser: ReasoningParser | None):
    """The tag ids the server's constrained requests wait for (see
    ``GuidedDecodingParams.reasoning_token_ids``): the parser's, unless the
    structured-outputs config's ``enable_in_reasoning`` is true; None without a parser or
    when the tokenizer lacks one of the tags as a single token (constraints then hold
    from the first token, with a warning)."""
    if parser is None or engine.decoding_config.enable_in_reasoning:
        return None
    ids = parser.tag_ids(engine.tokenizer) if engine.tokenizer is not None else None
    if ids is None:
        logger.warning(
            "--reasoning-parser %s: the tokenizer has no single token for <think> and "
            "</think>, so structured outputs constrain replies from the first token.",
            parser.name,
        )
    return ids


def validate_server_args(args: argparse.Namespace) -> EngineArgs:
    """Check every flag before anything is loaded: resolve the model (the default when
    none is given), load ``--chat-template``, build and validate the engine config.

    Sets ``args.model`` (the path), ``args.model_is_default``, ``args.chat_template``
    (the template text), ``args.tool_parser`` (the parser of tool_choice "auto", or
    None; after ``--tool-parser-plugin`` is imported), ``args.reasoning`` (the
    ``--reasoning-parser``, or None), ``args.middleware_objects`` (what each
    ``--middleware`` names) and ``args.log_error_stack`` (its default resolved).

    Raises:
        ValueError: naming the bad value (the caller prints it on one line, exit 2).
    """
    args.model_is_default = not (args.model or args.model_flag)
    if args.model and args.model_flag and args.model != args.model_flag:
        logger.warning(
            "Both MODEL (%s) and --model (%s) were given; serving MODEL.", args.model,
            args.model_flag,
        )  # fmt: skip
    args.model = resolve_model(args.model or args.model_flag, log=False)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}.")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {args.max_log_len}.")
    if args.max_request_body_bytes < 0:  # every body, even an empty one, would get 413
        raise ValueError(
            f"--max-request-body-bytes must be >= 0 (0: no limit), got "
            f"{args.max_request_body_bytes}."
        )
    if not args.shutdown_timeout >= 0:  # (NaN too)
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}.")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile must be given together.")
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"--{flag.replace('_', '-')} {path!r} is not a file.")
    if args.root_path and not args.root_path.startswith("/"):
        raise ValueError(f"--root-path must start with '/', got {args.root_path!r}.")
    if args.enable_log_requests and args.disable_log_requests:
        raise ValueError("--enable-log-requests and --disable-log-requests contradict: give one.")
    if args.enable_log_outputs and args.disable_log_requests:
        raise ValueError(
            "--enable-log-outputs logs outputs in the request log, which "
            "--disable-log-requests turns off: give one."
        )
    if args.log_error_stack is None:
        args.log_error_stack = envs.VLLM_SERVER_DEV_MODE
    if not args.response_role:
        raise ValueError("--response-role must not be empty.")
    check_default_template_kwargs(args.default_chat_template_kwargs)
    args.chat_template = load_chat_template(args.chat_template)
    if args.tool_parser_plugin is not None:
        load_tool_parser_plugin(args.tool_parser_plugin)
    args.tool_parser = None
    if args.tool_call_parser is not None:
        args.tool_parser = get_tool_parser(args.tool_call_parser)
    if args.enable_auto_tool_choice and args.tool_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (one of "
            f"{', '.join(tool_parser_names())})."
        )
    if not args.enable_auto_tool_choice:
        args.tool_parser = None
    args.reasoning = None
    if args.reasoning_parser is not None:
        args.reasoning = get_reasoning_parser(args.reasoning_parser)
    args.middleware_objects = [load_middleware(path) for path in args.middleware]
    engine_args = EngineArgs.from_cli_args(args)
    engine_args.create_engine_config()
    args.lora_requests = lora_requests(args.lora_modules, _served_names(args), args.enable_lora)
    return engine_args


def server_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 host in brackets (RFC 3986: ``http://[::1]:8000``)."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` before the engine is built, so a busy port fails at once.

    Raises:
        ValueError: the address cannot be bound (in use, not an address of this host).
    """
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}.") from e
    return sock


def uvicorn_options(args: argparse.Namespace) -> dict:
    """uvicorn.Config keywords from the server flags: TLS from ``--ssl-keyfile`` /
    ``--ssl-certfile`` / ``--ssl-ca-certs`` (uvicorn's names), ``access_log`` off with
    ``--disable-uvicorn-access-log``. ``--root-path`` is the app's (see :func:`build_app`),
    not uvicorn's, which would prefix every request path."""
    out: dict = {"access_log": not args.disable_uvicorn_access_log}
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        if getattr(args, flag) is not None:
            out[flag] = getattr(args, flag)
    return out


def event_loop_factory():
    """uvloop's event loop when it is installed (a requirement on Linux), else None (the
    asyncio default). Why: the server streams one small write per token per request and
    shares the GIL with the engine thread; uvloop runs the loop and its socket writes in C,
    so each streamed chunk costs less Python time (upstream's API server runs on uvloop
    too)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _served_names(args: argparse.Namespace) -> list[str]:
    """``--served-model-name``, else the model string given and its short name."""
    return args.served_model_name or served_model_names(args.model, not args.model_is_default)


def build_engine(args: argparse.Namespace, engine_args: EngineArgs) -> AsyncLLMEngine:
    """The server's engine (model loaded, KV cache sized, graphs captured).

    Raises:
        ValueError: a setting the engine refuses only once the model is loaded (a KV cache
            that cannot hold one max_model_len sequence); ``vllm serve`` reports it as
            the other bad settings (one ``error:`` line, exit status 2).
    """
    if args.model_is_default:
        logger.info("No MODEL given: serving the default SmolLM2-135M-Instruct GGUF %s", args.model)
    engine = AsyncLLMEngine(
        engine_args,
        metrics=EngineMetrics(_served_names(args)[0], log_stats=not args.disable_log_stats),
        log_requests=not args.disable_log_requests,
        max_log_len=args.max_log_len,
        log_outputs=args.enable_log_outputs,
    )
    try:
        for lora in args.lora_requests:  # each adapter read once, before serving
            engine.engine.adapters.check(lora)
    except ValueError:
        engine.engine.shutdown()  # the loop never started: stop the workers only
        raise
    return engine


def run_server(args: argparse.Namespace, engine: AsyncLLMEngine, sock: socket.socket) -> int:
    """Serve ``engine`` on ``sock`` until SIGINT/SIGTERM (returns 0) or until the engine
    dies (returns 1). ``args`` come from :func:`validate_server_args`, ``engine`` from
    :func:`build_engine`, ``sock`` from :func:`bind_socket`."""
    import uvicorn

    _GracefulServer = graceful_server_class()
    names = _served_names(args)
    limit = args.max_request_body_bytes or None
    api_key = args.api_key or envs.VLLM_API_KEY
    cors = CorsOptions(
        tuple(args.allowed_origins),
        tuple(args.allowed_methods),
        tuple(args.allowed_headers),
        args.allow_credentials,
    )
    app = build_app(
        engine,
        names,
        api_key,
        limit,
        args.chat_template,
        args.tool_parser,
        cors=cors,
        root_path=args.root_path,
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        lora_modules=args.lora_requests,
        enable_request_id_headers=args.enable_request_id_headers,
        disable_fastapi_docs=args.disable_fastapi_docs,
        chat_template_content_format=args.chat_template_content_format,
        reasoning_parser=args.reasoning,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_server_load_tracking=args.enable_server_load_tracking,
        middleware=args.middleware_objects,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        log_error_stack=args.log_error_stack,
    )
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout + ABORT_GRACE_S,
        timeout_keep_alive=5,
        **uvicorn_options(args),
    )
    server = _GracefulServer(config, engine, args.shutdown_timeout)
    engine.on_dead = server.engine_died
    scheme = "https" if args.ssl_certfile else "http"
    logger.info(
        "vLLM API server version %s listening on %s",
        __version__,
        server_url(scheme, args.host, port),
    )
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))
    logger.info("Server stopped (exit status %d).", server.exit_code)
    return server.exit_code


def serve(args: argparse.Namespace) -> int:
    """``vllm serve`` from parsed flags: check them, bind, build the engine, serve.
    Returns the exit status (2: a bad flag or a setting the engine refuses, printed as one
    ``error:`` line; ``--debug`` adds the traceback)."""
    configure_command_logging(args.debug)
    try:
        engine_args = validate_server_args(args)
        sock = bind_socket(args.host, args.port)
        engine = build_engine(args, engine_args)  # loads the model: KV capacity checked
    except ValueError as e:
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(f"error: {e}\n")
        return 2
    return run_server(args, engine, sock)


def main(argv: list[str] | None = None) -> int:
    """``python -m vllm.entrypoints.openai.api_server [MODEL] [flags]``: upstream V0's
    launch command, the same as ``vllm serve`` (``--config`` included; ``--help`` shows
    the same description and every flag's default)."""
    from vllm.entrypoints.config_file import expand_config_file
    from vllm.entrypoints.openai.cli_args import SERVE_DESCRIPTION, make_server_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser, HelpFormatter

    parser = FlexibleArgumentParser(
        prog="python -m vllm.entrypoints.openai.api_server",
        description=SERVE_DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    make_server_parser(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # expand_config_file reads the arguments of a ``serve`` command line
        argv = expand_config_file(["serve", *argv], parser)[1:]
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
