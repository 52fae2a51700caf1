"""The HTTP API of agent-runner (`agent-runner serve`): `create_app()` builds the ASGI application.

Web apps start turns, follow their events and answer approvals and forms over HTTP and
JSON, without importing the runner. See `docs/http-api.md`.
"""

from __future__ import annotations

from workers.api.app import create_app
from workers.api.auth import HandleDep, RuntimeDep, TenantDep, get_runtime, get_tenant, runtime_handle
from workers.api.embedding import include_api
from workers.api.runtime import RuntimeHandle
from workers.api.server_settings import ApiKeys, ApiSettings, WorkerMode

__all__ = [
    "ApiKeys",
    "ApiSettings",
    "HandleDep",
    "RuntimeDep",
    "RuntimeHandle",
    "TenantDep",
    "WorkerMode",
    "create_app",
    "get_runtime",
    "get_tenant",
    "include_api",
    "runtime_handle",
]
