"""What the OpenAPI document says about answers that every part of the API shares: errors, event streams, 405s.

Routes document their error statuses with `error_responses(404, 409, ...)` and their
server-sent events with `event_stream_response(...)`, so that one status means the same
thing on every route, and a stream is described the way readers of the document (and
checkers of it) read an event stream: each event an object of the SSE fields. A 405 names
the methods the document lists for the path (`documented_methods`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from starlette.types import Scope

from workers.api.bodies import ErrorResponse

Responses = dict[int | str, dict[str, Any]]
"""The `responses` argument of a FastAPI route or router."""

ERROR_DESCRIPTIONS: dict[int, str] = {
    401: "No valid API key or token (with API keys configured), or an expired or forged token.",
    403: "Not allowed with these credentials (the message says why).",
    404: "Unknown turn, agent, thread, run, assistant or cron, or one of another tenant.",
    409: "The command does not fit the turn or thread, or the conversation is busy (`active_turn_id`).",
    413: "The body is larger than 1 MiB.",
    422: "Malformed input; `details` lists each problem (`path`, `message`).",
    501: "A part of the protocol this server does not offer; the message names it.",
    503: "The database, Redis or the broker did not answer; retry later.",
}
"""What each error status of the API means, whichever route answers it."""


def error_responses(*statuses: int) -> Responses:
    """The OpenAPI `responses` of error statuses: each the `ErrorResponse` shape, described by `ERROR_DESCRIPTIONS`."""
    return {status: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]} for status in statuses}


def event_stream_response(description: str, data_schema: dict[str, Any] | None = None) -> Responses:
    """The 200 answer of a route that streams server-sent events.

    The schema is that of one event, as an event stream is read: an object of the fields
    `event`, `data`, `id` and `retry`, `data` holding JSON text (of `data_schema` when
    given, as its `contentSchema`).
    """
    data: dict[str, Any] = {"type": "string", "contentMediaType": "application/json"}
    if data_schema is not None:
        data["contentSchema"] = data_schema
    event = {
        "type": "object",
        "properties": {
            "event": {"type": "string"},
            "data": data,
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
        "required": ["data"],
    }
    return {200: {"description": description, "content": {"text/event-stream": {"schema": event}}}}


def documented_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the app's OpenAPI document lists for a path inside the app (with HEAD beside GET).

    This is the `Allow` of a 405: the methods of the resource, not only those of the first
    route whose path matched, which is all the router knows. Where a literal segment and a
    parameter both match (`/threads/search` and `/threads/{thread_id}`), the path with the
    fewest parameters names the resource, as the routes are declared.
    """
    matches: dict[int, set[str]] = {}
    for template, operations in app.openapi().get("paths", {}).items():
        parts = re.split(r"(\{[^}]+\})", template)
        pattern = "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in parts)
        if re.fullmatch(pattern, path):
            parameters = sum(part.startswith("{") for part in parts)
            matches.setdefault(parameters, set()).update(method.upper() for method in operations)
    methods = matches[min(matches)] if matches else set()
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def app_path(scope: Scope) -> str:
    """The request path inside the application (without the prefix it is mounted under, if any)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
