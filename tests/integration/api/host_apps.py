"""FastAPI applications of a team that embed the API, served by uvicorn for the embedding tests.

Each has routes of its own (`/healthz`, `/hello/{name}`) beside the API under `/agents`;
the API reads its settings from the environment (database, agents, worker mode).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from workers.api import create_app, include_api, runtime_handle


def _host(lifespan: Any = None) -> FastAPI:
    host = FastAPI(title="team app", lifespan=lifespan)

    @host.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @host.get("/hello/{name}")
    def hello(name: str, times: int = 1) -> dict[str, str]:
        return {"hello": name * times}

    return host


def mounted() -> FastAPI:
    """`host.mount("/agents", create_app())`, nothing else: the runtime starts on the first request."""
    host = _host()
    host.mount("/agents", create_app())
    return host


def mounted_with_lifespan() -> FastAPI:
    """The mounted application, its runtime started and stopped by the host's lifespan."""
    agents = create_app()
    host = _host(lifespan=runtime_handle(agents).lifespan)
    host.mount("/agents", agents)
    return host


def included() -> FastAPI:
    """The API's routes added to the host with `include_api`, sharing the host's lifespan."""
    host = _host()
    include_api(host, prefix="/agents")
    return host
