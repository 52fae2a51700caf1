"""`create_app`: the FastAPI application of `agent-runner serve`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from agent_runner import AgentLoader
from workers.api.a2a import A2A_PREFIX, guard_refusal
from workers.api.access_log import redact_access_log
from workers.api.auth import HANDLE_STATE, get_handle
from workers.api.bodies import ErrorResponse, HealthView, ReadyView
from workers.api.contract import CONTRACT_PATH, console_contract
from workers.api.cors import add_cors
from workers.api.docs import add_offline_docs
from workers.api.embedding import API_ROUTERS, prepare_settings
from workers.api.errors import ApiError, UnauthorizedError, install_error_handlers
from workers.api.event_streams import document_event_schemas
from workers.api.guard import RequestGuard
from workers.api.openapi import error_responses
from workers.api.runtime import RuntimeHandle
from workers.api.server_settings import ApiSettings, MetricsAccess, WorkerMode
from workers.telemetry import TelemetryError, render_metrics

STATIC_DIR = Path(__file__).resolve().parent / "static"

DESCRIPTION = """\
Start agent turns, follow them, and answer what they wait for: approvals, forms, questions.

Turns run on workers (embedded threads or Celery); every POST returns at once. Errors are
`{"error": {"type", "message", "details"}}`. Send `Idempotency-Key` on POSTs to make
retries safe. With API keys configured, send `Authorization: Bearer <key>`, or a short-lived token
from `POST /v1/tokens`.
"""


def create_app(
    settings: ApiSettings | None = None,
    *,
    agents: AgentLoader | None = None,
    database_url: str | None = None,
    worker: WorkerMode | str | None = None,
    environ: Mapping[str, str] | None = None,
    cors_origins: str | list[str] | tuple[str, ...] | None = None,
) -> FastAPI:
    """Build the HTTP API application.

    With no arguments everything is read from the environment, like the command line and
    the workers: `AGENT_RUNNER_DATABASE_URL`, `AGENT_RUNNER_AGENT_LOADER`,
    `AGENT_RUNNER_API_KEYS`, `AGENT_RUNNER_API_WORKER`, `AGENT_RUNNER_CORS_ORIGINS` (see
    `workers.api.server_settings`). The backends are built, and the embedded worker started, when
    the application starts (its lifespan), and stopped with it; mounted inside another
    application, which runs no lifespan of it, on the first request (see
    `workers.api.embedding`).

    Args:
        settings: The settings (default: `ApiSettings.from_env(environ)`).
        agents: The agents (default: `AGENT_RUNNER_AGENT_LOADER`).
        database_url: Overrides the database URL of the settings.
        worker: Overrides the worker mode (`embedded`, `celery` or `none`).
        environ: The environment to read instead of `os.environ`.
        cors_origins: Overrides the origins whose pages may call the API from a browser
            (a comma-separated string or a list; see `workers.api.cors`).

    Raises:
        SettingsError: A setting cannot be used (`*` among the origins of a server with
            API keys; `ScheduleError` for schedules that cannot be loaded, in the embedded
            mode, which fires them).
    """
    final = prepare_settings(
        settings, database_url=database_url, worker=worker, environ=environ, cors_origins=cors_origins
    )
    handle = RuntimeHandle(final, agents)
    redact_access_log()  # a filter on uvicorn's logger survives the log configuration uvicorn applies later
    app = FastAPI(
        title="agent-runner",
        version="1",
        description=DESCRIPTION,
        lifespan=handle.lifespan,
        docs_url=None,  # served from packaged assets instead of a CDN (workers.api.docs)
        redoc_url=None,
        openapi_tags=[
            {"name": "turns", "description": "Start, inspect, resume and cancel turns."},
            {"name": "events", "description": "Server-sent events of turns and conversations."},
            {"name": "conversations", "description": "A conversation's page timeline."},
            {"name": "agents", "description": "The agents this server runs."},
            {"name": "tokens", "description": "Short-lived tokens for browsers."},
            {"name": "ai-sdk", "description": "The AI SDK's `useChat` (UI message stream) over turns."},
            {"name": "ag-ui", "description": "AG-UI runs (`HttpAgent`) over turns."},
            {"name": "a2a", "description": "Each agent as an A2A 1.0 agent (JSON-RPC) with its agent card."},
            {"name": "health", "description": "Liveness and readiness probes."},
        ],
    )
    app.state.settings = final
    setattr(app.state, HANDLE_STATE, handle)
    install_error_handlers(app)
    app.add_middleware(RequestGuard, renderers={A2A_PREFIX: guard_refusal})
    add_cors(app, final.cors_origins)  # last: outermost, so that error answers carry its headers too
    for api_router in API_ROUTERS:
        app.include_router(api_router)
    _add_probes(app)
    document_event_schemas(app)
    add_offline_docs(app)
    _add_console(app)
    return app


def _add_probes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["health"], summary="Liveness", response_model=HealthView)
    def healthz() -> dict[str, Any]:
        """200 while the process serves requests."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        summary="Readiness",
        response_model=ReadyView,
        responses={503: {"model": ErrorResponse, "description": "A dependency did not answer; `details` names it."}},
    )
    def readyz(request: Request) -> JSONResponse:
        """200 when the database (and, with Celery, Redis and the broker) answer; else 503 naming what failed."""
        results = get_handle(request).get().readiness()
        failed = {name: reason for name, reason in results.items() if reason is not None}
        if failed:
            raise ApiError(
                503,
                "not ready: " + ", ".join(sorted(failed)),
                details=[{"component": name, "message": reason} for name, reason in sorted(failed.items())],
                type_name="NotReady",
                headers={"Retry-After": "5"},
            )
        return JSONResponse({"status": "ok", "checks": {name: "ok" for name in results}})

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **error_responses(401, 403, 503)},
    )
    def metrics(request: Request) -> Response:
        """The Prometheus text of this server (503 when prometheus-client is not installed).

        It counts the steps its embedded worker ran, the turns that ended, resumes, retries and
        lease takeovers, over all tenants. With `AGENT_RUNNER_METRICS_TOKEN` set, send it as
        `Authorization: Bearer <token>` (401 otherwise); with API keys set and no metrics
        token, 403: no tenant's key opens numbers that span tenants.
        """
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        access = request.app.state.settings.metrics_access(bearer.strip() if scheme.lower() == "bearer" else None)
        if access is MetricsAccess.UNAUTHORIZED:
            raise UnauthorizedError(
                "send the metrics token (AGENT_RUNNER_METRICS_TOKEN) as Authorization: Bearer <token>"
            )
        if access is MetricsAccess.CLOSED:
            raise ApiError(
                403, "the metrics span every tenant: set AGENT_RUNNER_METRICS_TOKEN to read them", type_name="Forbidden"
            )
        try:
            body, content_type = render_metrics()
        except TelemetryError as exc:
            raise ApiError(503, str(exc), type_name="MetricsUnavailable") from exc
        return Response(content=body, media_type=content_type)


def run_server(app: FastAPI, host: str, port: int) -> None:
    """Serve `app` with uvicorn until SIGTERM or Ctrl-C; open event streams then end at once, quietly.

    Uvicorn waits for open connections before it stops, and event streams stay open until
    their client leaves; told first, they end and the server stops without waiting.
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            handle = getattr(app.state, HANDLE_STATE, None)
            if isinstance(handle, RuntimeHandle) and handle.started:
                handle.get().fanout.close_streams()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)).run()


def _add_console(app: FastAPI) -> None:
    """Serve the console from `workers/api/static/` when it is there; else point `/` at the docs."""
    index = STATIC_DIR / "index.html"
    contract = console_contract()

    @app.get(CONTRACT_PATH, include_in_schema=False)
    def console_contract_module() -> Response:
        return Response(contract, media_type="text/javascript")

    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def root() -> Any:
        if index.is_file():
            return FileResponse(index)
        return JSONResponse({"name": "agent-runner", "docs": "/docs", "openapi": "/openapi.json"})
