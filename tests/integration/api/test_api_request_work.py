"""What POST /v1/turns does per request besides its saves: no worker-thread hop for its dependencies, no fingerprint without a key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fastapi.dependencies.utils
import pytest
from fastapi.testclient import TestClient

import workers.api.routes
from workers.api import create_app

pytestmark = pytest.mark.integration

BODY = {"agent_id": "support-agent", "input": "printer jam"}


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls: list[int] = []
    original: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_the_tenant_and_runtime_dependencies_take_no_worker_thread(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FastAPI runs a plain-function dependency in a worker thread: one hop each, per request.
    monkeypatch.setenv("AGENT_RUNNER_AGENT_LOADER", "workers.demo:build_agent")
    app = create_app(database_url=pg_url, worker="none")
    with TestClient(app) as client:
        hops = _counting(monkeypatch, fastapi.dependencies.utils, "run_in_threadpool")
        created = client.post("/v1/turns", json=BODY)
        assert created.status_code == 201, created.text
        assert client.get(f"/v1/turns/{created.json()['id']}").status_code == 200
    assert hops == []


def test_a_start_without_an_idempotency_key_computes_no_fingerprint(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_RUNNER_AGENT_LOADER", "workers.demo:build_agent")
    app = create_app(database_url=pg_url, worker="none")
    fingerprints = _counting(monkeypatch, workers.api.routes, "_fingerprint")
    with TestClient(app) as client:
        assert client.post("/v1/turns", json=BODY).status_code == 201
        assert fingerprints == []
        keyed = client.post("/v1/turns", json=BODY, headers={"Idempotency-Key": "k-1"})
        assert keyed.status_code == 201
        again = client.post("/v1/turns", json=BODY, headers={"Idempotency-Key": "k-1"})
        assert again.json() == keyed.json() and again.headers["Idempotent-Replayed"] == "true"
    assert len(fingerprints) == 2
