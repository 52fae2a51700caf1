"""A guard in front of the routes: request bodies are bounded and sane JSON before anything parses them.

Checked here, for every request with a body, so that no input reaches a route or a
database in a shape that could fail deep inside (a Python recursion limit, a string
PostgreSQL refuses, a float JSON cannot encode):

- at most `max_body_bytes` (1 MiB): 413, also for chunked bodies, counted as they arrive;
- UTF-8, well-formed JSON without `NaN`, `Infinity` or numbers too large for a float: 422;
- arrays and objects nested at most `max_depth` (64) deep: 422;
- no string (value or key) with a lone surrogate (an escaped `ud800` alone) or a NUL character: 422.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.api.errors import ApiError, InvalidRequestError, PayloadTooLargeError, render
from workers.api.openapi import app_path

MAX_BODY_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 64

_FORBIDDEN_CHARACTERS = re.compile("[\x00\ud800-\udfff]")
_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = False
    skip = -1  # the position of an escaped character, which never ends a string
    for match in _STRUCTURE.finditer(text):
        position = match.start()
        if position == skip:
            continue
        char = match.group()
        if in_string:
            if char == "\\":
                skip = position + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e400 parses to infinity, which JSON cannot carry back out.
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def check_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise `InvalidRequestError` unless `body` is UTF-8 JSON fit for the routes (see the module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise InvalidRequestError(f"the request body nests arrays and objects deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, dict):
            for key, nested in item.items():
                _check_string(key)
                pending.append(nested)
        elif isinstance(item, list):
            pending.extend(item)


def _check_string(value: str) -> None:
    found = _FORBIDDEN_CHARACTERS.search(value)
    if found is not None:
        what = "a NUL character" if found.group() == "\x00" else "a lone UTF-16 surrogate"
        raise InvalidRequestError(f"the request body holds a string with {what}, which cannot be stored")


class RequestGuard:
    """ASGI middleware applying the checks of this module to every HTTP request with a body.

    Args:
        app: The application behind the guard.
        max_body_bytes: Largest accepted body.
        max_depth: Deepest accepted JSON nesting.
        path_prefix: Check only requests whose path starts with this (in a host application
            that has the API's routes beside its own); empty: every request.
        renderers: How a refusal is told on paths starting with each key, for protocols whose
            errors have a shape of their own (JSON-RPC); elsewhere the API's error body.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_depth: int = MAX_JSON_DEPTH,
        path_prefix: str = "",
        renderers: Mapping[str, Callable[[ApiError], Response]] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_depth = max_depth
        self.path_prefix = path_prefix
        self.renderers = dict(renderers or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request, then pass it on with its body replayed."""
        if (
            scope["type"] != "http"
            or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE")
            or not app_path(scope).startswith(self.path_prefix)
        ):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            if body:
                check_json(body, self.max_depth)
        except ApiError as error:
            path = app_path(scope)
            renderer = next((r for prefix, r in self.renderers.items() if path.startswith(prefix)), render)
            await renderer(error)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise InvalidRequestError("the Content-Length header is not a number") from None
                if declared > self.max_body_bytes:
                    raise PayloadTooLargeError(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise PayloadTooLargeError(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)
