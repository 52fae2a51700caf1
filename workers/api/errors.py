"""Errors of the HTTP API and the handlers that give every one the same JSON shape.

Every error answer is `{"error": {"type", "message", "details": [...]}}` (plus
`active_turn_id` for a busy conversation). `type` is the name of the exception class (or the
name it had before it took the `Error` suffix: `wire_type`), so clients can tell `TurnNotFound`
from `AgentNotFound` without parsing messages. Runner errors are mapped by
`workers.views.classify_error`: unknown turn or agent 404, a command
that does not fit the turn or a busy conversation 409, malformed input 422 (also input over
a limit of the runner or text no store can keep, `InputLimitError`), a database or
Redis that did not answer 503. Anything unexpected is a 500 that names nothing internal.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_runner import (
    AgentConversationBusyException,
    AgentRunnerError,
    InputLimitError,
    InvalidCursorError,
    InvalidEventQueryError,
    InvalidResumeCommand,
)
from workers.api.openapi import app_path, documented_methods
from workers.views import ErrorKind, classify_error, schema_error_details

logger = logging.getLogger("workers.api")

STATUS_OF_KIND = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INVALID: 422,
    ErrorKind.CONFLICT: 409,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}

_HTTP_TYPES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    422: "InvalidRequest",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """An error answer of the API; raise it from a route and the handler renders it.

    Args:
        status: The HTTP status.
        message: What went wrong, for a person.
        details: Structured items, for example `{"path": "/field", "message": "..."}`.
        type_name: The `type` of the answer (default: the class's `wire_type`, else its name).
        headers: Extra response headers.
        extra: More members of the `error` object (for example `active_turn_id`).
    """

    wire_type: ClassVar[str | None] = None
    """The `type` of this class's answers when it is not the class name: clients read it, so a
    class renamed to end in `Error` keeps the name it was answered with."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        type_name: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = list(details or [])
        self.type_name = type_name or self.wire_type or type(self).__name__
        self.headers = dict(headers or {})
        self.extra = extra


class UnauthorizedError(ApiError):
    """The request has no valid API key."""

    wire_type = "Unauthorized"

    def __init__(self, message: str = "a valid API key is required: send Authorization: Bearer <key>") -> None:
        super().__init__(401, message, headers={"WWW-Authenticate": "Bearer"})


class InvalidRequestError(ApiError):
    """The request is malformed (a 422 raised by the server's own checks)."""

    wire_type = "InvalidRequest"

    def __init__(self, message: str, *, path: str = "", details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(422, message, details=details if details is not None else [{"path": path, "message": message}])


class PayloadTooLargeError(ApiError):
    """The request body is larger than the server accepts."""

    wire_type = "PayloadTooLarge"

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class TurnEndedError(ApiError):
    """A command for a turn that has already ended."""

    def __init__(self, turn_id: str, status: str) -> None:
        super().__init__(409, f"turn {turn_id!r} has already ended ({status})", turn_status=status)


class IdempotencyKeyReusedError(ApiError):
    """An idempotency key sent again with a different request."""

    wire_type = "IdempotencyKeyReused"

    def __init__(self, key: str) -> None:
        super().__init__(
            422,
            f"idempotency key {key!r} was first used for a different request (method, path or body); "
            "use a new key for a new request",
            details=[{"path": "Idempotency-Key", "message": "already used for a different request"}],
        )


class RecordNotFoundError(ApiError):
    """No record of this kind and id for this tenant (404); the `type` names the kind (`CronNotFound`)."""

    def __init__(self, kind: str, record_id: str) -> None:
        super().__init__(404, f"{kind} {record_id!r} not found", type_name=f"{kind.capitalize()}NotFound")
        self.kind = kind
        self.record_id = record_id


_RENAMED_RUNNER_ERRORS: dict[type[AgentRunnerError], str] = {
    InvalidCursorError: "InvalidCursor",
    InvalidEventQueryError: "InvalidEventQuery",
}
"""The `type` of runner errors whose class took the `Error` suffix after clients had read their old name."""


def runner_error_type(error: AgentRunnerError) -> str:
    """The `type` of an answer to a runner error: its class name, or the name a renamed class is known by."""
    return _RENAMED_RUNNER_ERRORS.get(type(error), type(error).__name__)


def error_body(
    type_name: str, message: str, details: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    """The JSON body of an error answer."""
    return {"error": {"type": type_name, "message": message, "details": list(details or []), **extra}}


_REQUEST_POINTERS = {"message": "/input", "form data": "/data", "resume metadata": "/metadata"}
"""The request members that the runner's names of refused input stand for, where the two differ."""


def input_limit_detail(error: InputLimitError) -> dict[str, str]:
    """The `details` item of refused input: where in the request, what is allowed and what was found."""
    field = error.field
    pointer = _REQUEST_POINTERS.get(field) or ("/" + field if field.isidentifier() else "")
    return {"path": pointer, "message": str(error), "limit": error.limit, "found": error.found}


def api_error_of(error: BaseException) -> ApiError:
    """The answer to an exception raised while serving a request."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, AgentRunnerError):
        kind = classify_error(error)
        status = STATUS_OF_KIND[kind]
        if kind is ErrorKind.INTERNAL:
            logger.error("request failed: %s: %s", type(error).__name__, error)
            return ApiError(500, "the server could not complete the request", type_name="InternalError")
        details: list[dict[str, Any]] = []
        extra: dict[str, Any] = {}
        if isinstance(error, InvalidResumeCommand):
            details = schema_error_details(error)
        if isinstance(error, InputLimitError):
            details = [input_limit_detail(error)]
        if isinstance(error, AgentConversationBusyException):
            extra = {"active_turn_id": error.active_turn_id, "active_turn_status": str(error.status)}
        headers = {"Retry-After": "1"} if status == 503 else None
        return ApiError(
            status, str(error), details=details, type_name=runner_error_type(error), headers=headers, **extra
        )
    logger.error("unexpected error while serving a request", exc_info=error)
    return ApiError(500, "the server could not complete the request", type_name="InternalError")


def render(error: ApiError) -> JSONResponse:
    """The JSON response of an `ApiError`."""
    return JSONResponse(
        error_body(error.type_name, error.message, error.details, **error.extra),
        status_code=error.status,
        headers=error.headers or None,
    )


def _pointer(location: tuple[Any, ...]) -> tuple[str, str]:
    """Split a pydantic error location into where (body, query, path, header) and a JSON Pointer."""
    if not location:
        return "body", ""
    where = str(location[0])
    parts = location[1:] if where in ("body", "query", "path", "header", "cookie") else location
    if where not in ("body", "query", "path", "header", "cookie"):
        where = "body"
    return where, "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def validation_details(error: RequestValidationError) -> list[dict[str, Any]]:
    """Readable items of a request validation error: location, JSON Pointer and message (never the input)."""
    details: list[dict[str, Any]] = []
    for item in error.errors():
        where, pointer = _pointer(tuple(item.get("loc", ())))
        details.append({"path": pointer, "location": where, "message": str(item.get("msg", "invalid"))})
    return details


async def _on_api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return render(error)


async def _on_runner_error(request: Request, error: Exception) -> JSONResponse:
    return render(api_error_of(error))


def validation_response(error: RequestValidationError) -> JSONResponse:
    """The 422 answer to a request that failed validation, in the API's error shape."""
    details = validation_details(error)
    summary = "; ".join(f"{d['location']}{d['path'] or ''}: {d['message']}" for d in details[:5])
    return render(ApiError(422, f"invalid request: {summary}", details=details, type_name="InvalidRequest"))


async def _on_validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return validation_response(error)


async def _on_http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    message = error.detail if isinstance(error.detail, str) else _HTTP_TYPES.get(error.status_code, "error")
    type_name = _HTTP_TYPES.get(error.status_code, "HTTPError")
    headers = dict(error.headers or {})
    if error.status_code == 405:
        # The router names the methods of the first route whose path matched; a resource
        # served by several routes (GET and POST /v1/turns) has the methods of them all.
        allowed = documented_methods(request.app, app_path(request.scope))
        if allowed:
            headers["Allow"] = ", ".join(allowed)
    return render(ApiError(error.status_code, message, type_name=type_name, headers=headers))


async def _on_unexpected(request: Request, error: Exception) -> JSONResponse:
    return render(api_error_of(error))


def install_error_handlers(app: FastAPI) -> None:
    """Render every error of `app` in the API's error shape."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(AgentRunnerError, _on_runner_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
