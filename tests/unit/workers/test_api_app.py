"""`workers.api:create_app()` with no arguments reads the environment like the command line (in-process, SQLite)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent_runner import InMemoryAgentLoader
from workers.api import create_app


def test_create_app_without_arguments_serves_the_agents_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_RUNNER_DATABASE_URL", f"sqlite:///{tmp_path / 'app.db'}")
    monkeypatch.setenv("AGENT_RUNNER_AGENT_LOADER", "workers.demo:build_agent")
    app = create_app()
    assert app.state.settings.worker_mode.value == "embedded"
    with TestClient(app) as client:
        assert [agent["id"] for agent in client.get("/v1/agents").json()["items"]] == ["support-agent"]
        turn = client.post("/v1/turns", json={"agent_id": "support-agent", "input": "VPN down"}).json()
        deadline = time.monotonic() + 20
        while client.get(f"/v1/turns/{turn['id']}").json()["status"] in ("READY", "RUNNING"):
            assert time.monotonic() < deadline, "the embedded worker never ran the turn"
            time.sleep(0.02)
        assert client.get(f"/v1/turns/{turn['id']}").json()["status"] == "WAITING_FOR_USER"


def test_worker_none_only_saves_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_RUNNER_AGENT_LOADER", "workers.demo:build_agent")
    monkeypatch.setenv("AGENT_RUNNER_API_WORKER", "none")
    app = create_app(database_url=f"sqlite:///{tmp_path / 'none.db'}", worker="none")
    with TestClient(app) as client:
        turn = client.post("/v1/turns", json={"agent_id": "support-agent", "input": "printer jam"}).json()
        time.sleep(0.3)
        assert client.get(f"/v1/turns/{turn['id']}").json()["status"] == "READY"


def test_the_docs_of_a_mounted_app_link_their_assets_under_the_mount_path(tmp_path: Path) -> None:
    from fastapi import FastAPI

    host = FastAPI()
    host.mount("/agents", create_app(database_url=f"sqlite:///{tmp_path / 'm.db'}", agents=_no_agents()))
    client = TestClient(host)
    page = client.get("/agents/docs").text
    assert 'src="/agents/docs-assets/swagger-ui-bundle.js"' in page and "url: '/agents/openapi.json'" in page
    assert client.get("/agents/docs-assets/swagger-ui.css").status_code == 200
    assert client.get("/agents/openapi.json").json()["info"]["title"] == "agent-runner"


def _no_agents() -> InMemoryAgentLoader:
    return InMemoryAgentLoader([])


def _metrics_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], bearer: str | None) -> int:
    monkeypatch.setenv("AGENT_RUNNER_AGENT_LOADER", "workers.demo:build_agent")
    for name in ("AGENT_RUNNER_API_KEYS", "AGENT_RUNNER_METRICS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = create_app(database_url=f"sqlite:///{tmp_path / 'metrics.db'}", worker="none")
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    with TestClient(app) as client:
        response = client.get("/metrics", headers=headers)
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and "AGENT_RUNNER_METRICS_TOKEN" in error["message"]
    return response.status_code


KEYS = {"AGENT_RUNNER_API_KEYS": "acme:key-acme,globex:key-globex"}
TOKEN = {"AGENT_RUNNER_METRICS_TOKEN": "scrape-token"}


@pytest.mark.parametrize(
    ("env", "bearer", "status"),
    [
        pytest.param({}, None, 200, id="one-tenant-open"),
        pytest.param(KEYS, None, 403, id="tenants-without-token-closed"),
        pytest.param(KEYS, "key-acme", 403, id="tenants-a-tenant-key-never-opens-it"),
        pytest.param({**KEYS, **TOKEN}, None, 401, id="token-required"),
        pytest.param({**KEYS, **TOKEN}, "key-acme", 401, id="token-not-a-tenant-key"),
        pytest.param({**KEYS, **TOKEN}, "scrape-token", 200, id="token-opens-it"),
        pytest.param(TOKEN, None, 401, id="one-tenant-with-token-required"),
        pytest.param(TOKEN, "scrape-token", 200, id="one-tenant-with-token"),
    ],
)
def test_metrics_span_tenants_so_only_the_metrics_token_opens_them_when_keys_are_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], bearer: str | None, status: int
) -> None:
    assert _metrics_status(tmp_path, monkeypatch, env, bearer) == status
