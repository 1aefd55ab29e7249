"""The OpenAI-compatible server's FastAPI app around an AsyncLLMEngine (:func:`build_app`;
``vllm serve`` runs it with uvicorn, vllm/entrypoints/openai/api_server.py).

Endpoints: /v1/models, /v1/completions, /v1/chat/completions, /v1/responses
(serving_responses.py), /tokenize, /detokenize (serving_tokenization.py), the pooling APIs
of an embedding engine (pooling_routes.py), /invocations (SageMaker's route: chat or
completion by the body, embeddings on an embedding engine), /health (and its alias /ping),
/version, /metrics (Prometheus text, this server's own registry), POST /start_profile and
/stop_profile (only with VLLM_TORCH_PROFILER_DIR set), POST /reset_prefix_cache (only with
VLLM_SERVER_DEV_MODE=1).

Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for bad
requests (malformed JSON, pydantic validation errors and ValueErrors included), 401 for a
missing or wrong key when ``--api-key`` is set, 404 for an unknown model, 413 for a body
above ``--max-request-body-bytes``, 500 when a request fails in the engine, 503 once the
engine is dead.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm import envs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.entrypoints.openai.api_errors import APIError, set_log_error_stack, to_api_error
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
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_embedding import EmbeddingRequest
from vllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from vllm.entrypoints.openai.serving_tokenization import (
    DetokenizeRequest,
    OpenAIServingTokenization,
    TokenizeRequest,
)
from vllm.entrypoints.openai.tool_parsers import ToolParser
from vllm.lora.request import LoRARequest
from vllm.reasoning import ReasoningParser
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
    trust_request_chat_template: bool = False,
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
        exclude_tools_when_tool_choice_none / default_chat_template_kwargs /
            trust_request_chat_template: the flags of those names (see
            :class:`OpenAIServingChat`).
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
        trust_request_chat_template=trust_request_chat_template,
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
