"""The API inside a team's own FastAPI application: mounted as a whole, or its routes added to the host.

Two ways, both on one process and one runtime (stores, worker threads or Celery wiring):

```python
from fastapi import FastAPI
from workers.api import create_app, include_api, runtime_handle

# 1. Mount the whole application (console and docs included) under a path.
agents = create_app()
host = FastAPI(lifespan=runtime_handle(agents).lifespan)   # optional: start and stop it with the host
host.mount("/agents", agents)

# 2. Add the routes to the host, next to its own; the runtime joins the host's lifespan.
host = FastAPI()
include_api(host, prefix="/agents")
```

A mounted application gets no lifespan of its own (the server sends it to the host only):
without the hook, its runtime starts on the first request, which the log says, and stops
when the process exits. Included routes keep the API's error shape and request checks
(bounded, sane JSON bodies) without changing those of the host's own routes; the host's
CORS, docs and probes stay the host's.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import replace

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from agent_runner import AgentLoader, AgentRunnerError
from workers.api import auth, event_streams, routes
from workers.api.a2a import A2A_PREFIX, guard_refusal
from workers.api.a2a import router as a2a_router
from workers.api.auth import HANDLE_STATE
from workers.api.errors import ApiError, api_error_of, render, validation_response
from workers.api.guard import RequestGuard
from workers.api.langgraph import router as langgraph_router
from workers.api.protocols import ag_ui, ai_sdk
from workers.api.runtime import RuntimeHandle
from workers.api.server_settings import ApiSettings, WorkerMode, default_worker_mode

API_ROUTERS = (
    routes.router,
    event_streams.router,
    auth.router,
    ai_sdk.router,
    ag_ui.router,
    langgraph_router,
    a2a_router,
)
"""The routers of the API, in the order they are added (a new router of the API goes here).

All are under `/v1` except the LangGraph API's (`/assistants`, `/threads`, `/runs`), which
LangGraph clients expect at the server's root, and A2A's (`/a2a/{agent_id}`)."""


def prepare_settings(
    settings: ApiSettings | None,
    *,
    database_url: str | None = None,
    worker: WorkerMode | str | None = None,
    environ: Mapping[str, str] | None = None,
    cors_origins: str | list[str] | tuple[str, ...] | None = None,
) -> ApiSettings:
    """The settings of `create_app` and `include_api`: from the environment unless given, with the overrides.

    Raises:
        SettingsError: A setting cannot be used (`ScheduleError` for schedules that cannot
            be loaded, in the embedded mode, which fires them).
    """
    from workers.api.cors import parse_origins

    settings = settings if settings is not None else ApiSettings.from_env(environ)
    if database_url is not None:
        settings = replace(
            settings,
            workers=replace(settings.workers, database_url=database_url),
            worker_mode=default_worker_mode(database_url),
        )
    if worker is not None:
        settings = replace(settings, worker_mode=WorkerMode(worker))
    if cors_origins is not None:
        listed = cors_origins if isinstance(cors_origins, str) else ",".join(cors_origins)
        settings = replace(settings, cors_origins=parse_origins(listed, "cors_origins"))
    if settings.worker_mode is WorkerMode.EMBEDDED and settings.workers.schedules is not None:
        # The embedded worker fires the scheduled turns: a definition it cannot load stops
        # the start here, before the server listens, as it stops `celery beat`.
        from workers.schedules import load_schedules

        load_schedules(settings.workers.schedules)
    return settings


def include_api(
    host: FastAPI,
    settings: ApiSettings | None = None,
    *,
    prefix: str = "",
    agents: AgentLoader | None = None,
    database_url: str | None = None,
    worker: WorkerMode | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RuntimeHandle:
    """Add the `/v1` routes to `host` (under `prefix`), with a runtime that starts and stops with the host's lifespan.

    Arguments are those of `create_app`. CORS is the host's own business (its middleware
    covers these routes too); `AGENT_RUNNER_CORS_ORIGINS` is not applied here.

    Returns:
        The runtime's handle (`runtime_handle(host)` returns it too).

    Raises:
        SettingsError: A setting cannot be used.
        ValueError: `host` already has the API's routes.
    """
    if getattr(host.state, HANDLE_STATE, None) is not None:
        raise ValueError("this application already has the agent-runner API; include it once per application")
    handle = RuntimeHandle(
        prepare_settings(settings, database_url=database_url, worker=worker, environ=environ), agents
    )
    setattr(host.state, HANDLE_STATE, handle)
    # FastAPI runs an included router's lifespan inside the host's: the runtime starts
    # with the host and stops with it.
    api = APIRouter(lifespan=handle.lifespan)
    for router in API_ROUTERS:
        api.include_router(router)
    host.include_router(api, prefix=prefix)
    event_streams.document_event_schemas(host)
    host.add_middleware(RequestGuard, path_prefix=f"{prefix}/v1/")
    host.add_middleware(RequestGuard, path_prefix=f"{prefix}{A2A_PREFIX}", renderers={"": guard_refusal})
    _render_api_errors(host)
    return handle


def is_api_route(request: Request) -> bool:
    """Whether the request was routed to one of the API's own routes."""
    route = request.scope.get("route")
    endpoint = getattr(route, "endpoint", None)
    return getattr(endpoint, "__module__", "").startswith("workers.api.")


def _render_api_errors(host: FastAPI) -> None:
    """Give the API's routes their error shape in `host`, leaving the host's routes as they were."""

    async def on_api_error(request: Request, error: Exception) -> Response:
        return render(api_error_of(error))

    previous = host.exception_handlers.get(RequestValidationError, request_validation_exception_handler)

    async def on_validation_error(request: Request, error: Exception) -> Response:
        if is_api_route(request):
            assert isinstance(error, RequestValidationError)
            return validation_response(error)
        answer = previous(request, error)
        return await answer if inspect.isawaitable(answer) else answer

    host.add_exception_handler(ApiError, on_api_error)
    host.add_exception_handler(AgentRunnerError, on_api_error)
    host.add_exception_handler(RequestValidationError, on_validation_error)
