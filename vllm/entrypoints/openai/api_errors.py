"""OpenAI-style errors of the server: ``{"error": {message, type, param, code}}`` with the
HTTP status, as a JSON response or as one server-sent event of a stream that has begun;
which request field a ValueError's message names; and the mapping of exceptions raised
while serving to those errors."""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus

from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
)

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with HTTP status ``code``."""

    def __init__(self, message: str, code: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.code, self.param = message, code, param

    def body(self) -> dict:
        err = ErrorInfo(
            message=self.message,
            type=_ERROR_TYPES.get(self.code, HTTPStatus(self.code).phrase.replace(" ", "")),
            param=self.param,
            code=self.code,
        )
        return ErrorResponse(error=err).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.code)

    def sse(self) -> str:
        """The error as one server-sent event (for a stream whose headers are sent)."""
        return f"data: {json.dumps(self.body())}\n\n"


# The fields of the two request bodies: what an error's ``param`` may name.
_REQUEST_FIELDS = frozenset(CompletionRequest.model_fields) | frozenset(
    ChatCompletionRequest.model_fields
)


def param_of(message: str) -> str | None:
    """The request field a ValueError names: the request field it starts with ("seed must
    be ...", "logprobs=21 is more than ..."), else None."""
    head = re.match(r"[A-Za-z_][A-Za-z0-9_]*(?=[ =:,.]|$)", message)
    return head.group(0) if head and head.group(0) in _REQUEST_FIELDS else None


# ``--log-error-stack`` (set by build_app; one server per process).
_log_error_stack = False


def set_log_error_stack(enabled: bool) -> None:
    """``--log-error-stack``: whether :func:`to_api_error` logs the traceback of every
    exception it turns into an error response."""
    global _log_error_stack
    _log_error_stack = enabled


def to_api_error(e: Exception) -> APIError:
    """Map an exception raised while serving to an APIError: ValueError -> 400, a request
    failed in the engine -> 500, a dead or stopping engine -> 503, anything else -> 500,
    logged with its traceback (the engine logs its own failures). With
    ``--log-error-stack`` every one is logged with its traceback at ERROR, as upstream
    logs the stack of its error responses (the response is the same)."""
    from vllm.engine.async_llm_engine import EngineDeadError, RequestFailedError

    if isinstance(e, APIError):
        err = e
    elif isinstance(e, RequestFailedError):
        err = APIError(f"The request failed inside the engine: {e}", 500)
    elif isinstance(e, EngineDeadError):
        err = APIError(str(e), 503)
    elif isinstance(e, ValueError):
        err = APIError(str(e), 400, param_of(str(e)))
    else:
        logger.error("Internal error while serving a request", exc_info=e)  # a server bug
        return APIError(f"{type(e).__name__}: {e}", 500)
    if _log_error_stack:
        logger.error("Error response (HTTP %d): %s", err.code, err.message, exc_info=e)
    return err
