"""The API inside a team's FastAPI application, served by uvicorn: mounted (`host.mount`) and included (`include_api`).

Each host passes the core flow over real HTTP, in the embedded mode (SQLite, worker
threads in the host process) and in the Celery mode (PostgreSQL, Redis and a real Celery
worker process): start a turn, fill its form, approve its call, follow its events to
`end`, completed. The host's own routes keep answering as before.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_REDIS_URL
from tests.helpers.api_server import ApiServer, server_env
from tests.integration.api import host_apps
from tests.integration.api.api_server import AGENTS, assert_error, blocked, read_stream, status_is, wait_for
from tests.integration.celery_workers.celery_cluster import Cluster, cluster_env, delete_prefix

pytestmark = pytest.mark.integration

FIRST_USE_NOTICE = "starting its runtime on first use"


def host_server(factory: str, env: dict[str, str], log: Path, agents: str = AGENTS) -> ApiServer:
    """uvicorn serving `host_apps.<factory>()` with `env`, the API serving `agents`."""
    command = [sys.executable, "-m", "uvicorn", "--factory", f"{host_apps.__name__}:{factory}", "--host", "127.0.0.1"]
    return ApiServer(agents=agents, env={**env, "AGENT_RUNNER_AGENT_LOADER": agents}, log=log, command=command)


def run_core_flow(server: ApiServer, conversation_id: str) -> None:
    """Start a turn, fill its form, approve its call, follow its events to `end`: COMPLETED."""
    with httpx.Client(base_url=f"{server.url}/agents", timeout=30) as client:
        body = {"agent_id": "desk", "input": "ticket", "conversation_id": conversation_id}
        created = client.post("/v1/turns", json=body)
        assert created.status_code == 201, created.text
        turn_id = created.json()["id"]
        form = wait_for(client, turn_id, blocked)["suspension"]
        assert form["form"]["key"] == "ticket_details"
        data = {"system": "vpn", "scope": "ONE_USER"}
        submitted = client.post(
            f"/v1/turns/{turn_id}/resume", json={"action": "form", "tool_call_id": form["correlation_id"], "data": data}
        )
        assert submitted.status_code == 202, submitted.text
        approval = wait_for(client, turn_id, status_is("WAITING_FOR_APPROVAL"))["suspension"]
        approved = client.post(
            f"/v1/turns/{turn_id}/resume", json={"action": "approve", "tool_call_id": approval["correlation_id"]}
        )
        assert approved.status_code == 202, approved.text
        _, events = read_stream(client, f"/v1/turns/{turn_id}/events")
        assert events[-1]["event"] == "end" and events[-1]["data"] == {"turn_id": turn_id, "status": "COMPLETED"}
        assert "TURN_COMPLETED" in [e["event"] for e in events]
        done = client.get(f"/v1/turns/{turn_id}").json()
        assert (done["status"], done["final_output"]) == ("COMPLETED", "opened TICKET-vpn-ONE_USER")
        # The API's error shape and request checks hold inside the host.
        assert_error(client.post("/v1/turns", json={"agent_id": "desk"}), 422, "InvalidRequest")
        assert_error(client.post("/v1/turns", content=b'{"agent_id": "desk", "input": NaN}'), 422, "InvalidRequest")
        oversized = b'{"agent_id": "desk", "input": "' + b"x" * (1024 * 1024) + b'"}'
        assert_error(client.post("/v1/turns", content=oversized), 413, "PayloadTooLarge")
        assert_error(client.get("/v1/turns/unknown-turn"), 404, "TurnNotFound")


def check_host_routes(server: ApiServer) -> None:
    """The host's own routes answer as FastAPI answers them, validation errors included."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/hello/ab", params={"times": 2}).json() == {"hello": "abab"}
        invalid = client.get("/hello/ab", params={"times": "many"})
        assert invalid.status_code == 422 and "detail" in invalid.json() and "error" not in invalid.json()


def serve_and_run(factory: str, env: dict[str, str], log: Path) -> ApiServer:
    """Serve `host_apps.<factory>()`, run the core flow and check the host's routes; return the stopped server."""
    server = host_server(factory, env, log)
    server.start()
    try:
        run_core_flow(server, f"c-{factory}")
        check_host_routes(server)
    finally:
        server.stop()
    return server


# --- embedded mode (SQLite) -------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["mounted", "mounted_with_lifespan", "included"])
def test_a_host_app_embedding_the_api_runs_the_core_flow_on_sqlite(factory: str, tmp_path: Path) -> None:
    # Given a team's app with the API under /agents, on a SQLite file
    # When a turn goes through its form and approval, Then it completes and its stream ends
    server = serve_and_run(factory, server_env(f"sqlite:///{tmp_path / 'host.db'}"), tmp_path / "host.log")
    # A mounted app without the hook says, once, that its runtime started on first use.
    assert server.output().count(FIRST_USE_NOTICE) == (1 if factory == "mounted" else 0), server.output()


def test_a_mounted_app_whose_runtime_cannot_start_answers_503_naming_why(tmp_path: Path) -> None:
    # The agents cannot be loaded: every request says so (503), none is a bare 500.
    env = server_env(f"sqlite:///{tmp_path / 'host.db'}")
    server = host_server("mounted", env, tmp_path / "host.log", agents="tests.no_such_module:agents")
    server.start()
    try:
        with httpx.Client(base_url=f"{server.url}/agents", timeout=30) as client:
            for _ in range(2):
                error = assert_error(client.get("/v1/agents"), 503, "RuntimeUnavailableError")
                assert "tests.no_such_module" in error["message"]
    finally:
        server.stop()


# --- Celery mode (PostgreSQL, Redis, a Celery worker process) -------------------------------


@pytest.fixture
def celery_env(pg_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A Celery worker process of this test on its own schema and Redis namespace; the environment to reach it."""
    namespace = f"ar-host-{uuid.uuid4().hex[:10]}"
    env = cluster_env(
        schema_url=pg_url, redis_url=TEST_REDIS_URL, namespace=namespace, AGENT_RUNNER_AGENT_LOADER=AGENTS
    )
    cluster = Cluster(env=env, tmp_path=tmp_path, redis_url=TEST_REDIS_URL)
    try:
        cluster.start_worker("w1")
        yield env
    finally:
        cluster.stop_all()
        cluster.close()
        delete_prefix(TEST_REDIS_URL, namespace)


@pytest.mark.parametrize("factory", ["mounted", "included"])
def test_a_host_app_embedding_the_api_runs_the_core_flow_on_celery_workers(
    factory: str, celery_env: dict[str, str], tmp_path: Path
) -> None:
    serve_and_run(factory, celery_env, tmp_path / "host.log")
