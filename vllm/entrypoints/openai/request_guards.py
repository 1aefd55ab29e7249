"""What the OpenAI server refuses before a handler runs: request bodies above
``--max-request-body-bytes`` (413) and bodies that are not valid JSON or do not match the
request model (400, with a message that says what is wrong and where)."""

from __future__ import annotations

import uuid

from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm.entrypoints.openai.api_errors import APIError

# Default of --max-request-body-bytes: far above any prompt that fits a context window as
# text or token ids, far below what would take the server seconds to parse.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024


class BodySizeLimit:
    """ASGI middleware answering 413 for a request body above ``limit`` bytes: at once from
    Content-Length, else (chunked bodies) as soon as the bytes received pass the limit."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _message(self, size: str) -> str:
        return (
            f"The request body ({size}) is larger than the limit of {self.limit} bytes "
            "(--max-request-body-bytes)."
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            resp = APIError(self._message(f"{int(length)} bytes"), 413).response()
            return await resp(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.limit:
                    # FastAPI re-raises HTTPExceptions from body reading; answered below.
                    raise StarletteHTTPException(413, self._message(f"over {received} bytes"))
            return msg

        await self.app(scope, limited_receive, send)


def _app_path(scope) -> str:
    """The request's path inside the app: without the ``--root-path`` prefix, which the
    routes also answer under (``/api/v1/models`` is ``/v1/models``)."""
    path, root = scope["path"], scope.get("root_path") or ""
    return path[len(root) :] if root and path.startswith(root) else path


# Path prefixes (inside the app) that need the API key.
_GUARDED = ("/v1", "/v2", "/invocations")


class ApiKeyAuth:
    """ASGI middleware answering 401 to a ``/v1``, ``/v2`` or ``/invocations`` request
    (upstream guards ``/v1`` and ``/v2``; ``/invocations`` runs the same models; with or
    without the ``--root-path`` prefix) whose ``Authorization`` header is not ``Bearer <api_key>``;
    every other request passes untouched.

    A plain ASGI wrapper, not Starlette's ``@app.middleware("http")``: that one runs each
    response through an extra memory stream and task, a cost paid on every streamed chunk
    (about 0.1 ms each on a 2-core host, so milliseconds per engine step at 32 streams).
    """

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _app_path(scope).startswith(_GUARDED):
            if dict(scope["headers"]).get(b"authorization") != self.expected:
                resp = APIError("Unauthorized: missing or wrong API key.", 401).response()
                return await resp(scope, receive, send)
        await self.app(scope, receive, send)


# ASGI scope key of the fresh id RequestIdHeader sends back to a request without one.
FRESH_REQUEST_ID = "vllm.fresh_request_id"


class RequestIdHeader:
    """ASGI middleware (``--enable-request-id-headers``, as upstream): every HTTP response
    carries ``X-Request-Id``, the request's own header when it sent one, else a fresh
    uuid4 hex. The fresh id is also left in the scope (:data:`FRESH_REQUEST_ID`), where
    the handlers take it as the base of the response's ``id`` and the engine request id
    when the body names none (upstream's fresh header id is unrelated to them). A plain
    ASGI wrapper for the reason :class:`ApiKeyAuth` gives."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = dict(scope["headers"]).get(b"x-request-id")
        if not rid:
            rid = uuid.uuid4().hex.encode()
            scope = {**scope, FRESH_REQUEST_ID: rid.decode()}

        async def with_id(msg):
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), (b"x-request-id", rid)]}
            await send(msg)

        await self.app(scope, receive, with_id)


def validation_message(errs: list[dict]) -> tuple[str, str | None]:
    """OpenAI-style (message, param) for pydantic / JSON errors of a request body."""
    if errs and errs[0].get("type") == "json_invalid":
        where = errs[0]["loc"][-1]
        why = (errs[0].get("ctx") or {}).get("error", "malformed JSON")
        return f"The request body is not valid JSON: {why} at character {where}.", None
    param = ".".join(str(p) for p in errs[0]["loc"][1:]) if errs else None
    msg = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in errs)
    return msg, param or None


# The model APIs whose requests --enable-server-load-tracking counts (paths inside the app).
LOAD_TRACKED_PATHS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/pooling",
    "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize",
    "/invocations",
})  # fmt: skip


class LoadCounter:
    """The number of model-API requests in flight (``GET /load``'s ``server_load``)."""

    def __init__(self):
        self.value = 0


class LoadTracker:
    """ASGI middleware (``--enable-server-load-tracking``, as upstream): counts each request
    to :data:`LOAD_TRACKED_PATHS` in ``counter`` from its arrival until its response is
    sent in full (a stream until its last chunk) or the client goes away. A plain ASGI
    wrapper for the reason :class:`ApiKeyAuth` gives."""

    def __init__(self, app, counter: LoadCounter):
        self.app = app
        self.counter = counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _app_path(scope) not in LOAD_TRACKED_PATHS:
            return await self.app(scope, receive, send)
        self.counter.value += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.value -= 1
