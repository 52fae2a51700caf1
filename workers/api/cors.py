"""Cross-origin requests: which web origins may call the API from a browser (`AGENT_RUNNER_CORS_ORIGINS`).

A page served from another origin (a team's own front end) calls the API with `fetch` and
`EventSource`. The browser asks first (a preflight `OPTIONS` request) for any request with
an `Authorization`, `Idempotency-Key` or JSON body, and reads an answer only when it names
the page's origin. Origins are listed exactly (`https://app.example.com`,
`http://localhost:5173`); `*` allows any origin, which a server with API keys refuses: a
key or token that leaks to any web page would then work from every site.

No cookies are involved (credentials travel as bearer keys or tokens), so answers never
carry `Access-Control-Allow-Credentials`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from workers.settings import SettingsError

CORS_VARIABLE = "AGENT_RUNNER_CORS_ORIGINS"

ANY_ORIGIN = "*"

ALLOWED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""Every method a route of the API answers (the LangGraph SDKs update and delete threads and crons)."""
ALLOWED_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "x-api-key")
"""The request headers the API reads; a browser sends no other header cross-origin."""
EXPOSED_HEADERS = (
    "Content-Location",
    "Idempotent-Replayed",
    "Location",
    "Retry-After",
    "WWW-Authenticate",
)
"""Response headers a cross-origin page may read besides the always-readable ones.

The LangGraph SDKs learn a new run's id from `Content-Location` (and a stream's `Location`).
"""
PREFLIGHT_MAX_AGE_S = 600


def parse_origins(value: str | None, variable: str = CORS_VARIABLE) -> tuple[str, ...]:
    """Parse a comma-separated list of origins (`scheme://host[:port]`, or `*`); empty or unset means none.

    Raises:
        SettingsError: An entry is not an origin (it has a path, a query, credentials or
            another scheme than http and https).
    """
    if value is None or not value.strip():
        return ()
    origins: list[str] = []
    for entry in value.split(","):
        origin = entry.strip()
        if not origin:
            continue
        if origin != ANY_ORIGIN:
            _check_origin(origin, value, variable)
        if origin not in origins:
            origins.append(origin)
    return tuple(origins)


def _check_origin(origin: str, value: str, variable: str) -> None:
    problem: str | None = None
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        problem = "it does not parse as a URL"
    else:
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "an origin is http:// or https:// followed by a host"
        elif parts.path or parts.query or parts.fragment:
            problem = "an origin has no path, query or fragment (not even a trailing /)"
        elif parts.username is not None or parts.password is not None:
            problem = "an origin carries no credentials"
    if problem is not None:
        raise SettingsError(variable, value, f"{origin!r} is not an origin: {problem}")


def check_origins(origins: tuple[str, ...], *, keys_enabled: bool, variable: str = CORS_VARIABLE) -> None:
    """Refuse `*` on a server with API keys.

    Raises:
        SettingsError: `*` is among the origins and API keys are configured.
    """
    if ANY_ORIGIN in origins and keys_enabled:
        raise SettingsError(
            variable,
            ",".join(origins),
            "'*' lets every web site call an API that has keys; list the origins of your front ends instead",
        )


def add_cors(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Answer preflights and mark answers readable for `origins` (nothing is added when there are none).

    Added last, so it wraps every other middleware: error answers (401, 413, 422) carry the
    headers too, and a page can read why it was refused.
    """
    if not origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=list(ALLOWED_METHODS),
        allow_headers=list(ALLOWED_HEADERS),
        expose_headers=list(EXPOSED_HEADERS),
        allow_credentials=False,
        max_age=PREFLIGHT_MAX_AGE_S,
    )
