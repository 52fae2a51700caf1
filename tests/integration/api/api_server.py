"""Helpers of the HTTP API tests: the server of `api_agents`, polling a turn, errors and server-sent events."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_REDIS_URL
from tests.helpers.api_server import ApiServer, running_server
from tests.integration.api import api_agents
from tests.integration.celery_workers.celery_cluster import Cluster, clusters

AGENTS = f"{api_agents.__name__}:build_loader"


def wait_for(client: httpx.Client, turn_id: str, until: Any, timeout: float = 20.0, what: str = "") -> dict[str, Any]:
    """Poll GET /v1/turns/{id} until `until(view)`; return the view."""
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = client.get(f"/v1/turns/{turn_id}").json()
        if until(view):
            return view
        if time.monotonic() > deadline:
            pytest.fail(f"turn {turn_id} never reached {what or until}: {view}")
        time.sleep(0.05)


def blocked(view: dict[str, Any]) -> bool:
    return view["status"] not in ("READY", "RUNNING")


def status_is(*statuses: str) -> Any:
    return lambda view: view["status"] in statuses


def assert_error(response: httpx.Response, status: int, type_name: str | None = None) -> dict[str, Any]:
    """The response is an error answer of this status, in the API's error shape."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], list)
    if type_name is not None:
        assert error["type"] == type_name, error
    return error


def serve(
    tmp_path: Path, database_url: str | None = None, args: list[str] | None = None, **env: str
) -> Iterator[ApiServer]:
    """Start a server of the `api_agents` for a fixture and stop it afterwards."""
    yield from running_server(AGENTS, tmp_path, database_url, args, **env)


def eventually(produce: Any, timeout: float = 20.0, what: str = "the condition") -> Any:
    """Call `produce()` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = produce()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def database_state(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every agent-runner table, to check that a request changed nothing."""
    import sqlalchemy as sa

    from store.schema import metadata

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return {
                table.name: sorted(
                    (tuple(str(value) for value in row) for row in connection.execute(sa.select(table))), key=str
                )
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "MAX_ITERATIONS_REACHED", "MAX_STEPS_REACHED", "BUDGET_EXCEEDED")


def ended(view: dict[str, Any]) -> bool:
    return view["status"] in TERMINAL


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of a server-sent-events body: `{"id", "event", "data"}` (data parsed as JSON), comments dropped."""
    import json

    events: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if fields:
            if "data" in fields:
                fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def read_stream(
    client: httpx.Client, path: str, *, until_end: bool = True, **kwargs: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Read an SSE stream until `event: end` (or until the server closes it); return the raw text and the events."""
    chunks: list[str] = []
    with client.stream("GET", path, timeout=httpx.Timeout(30, read=30), **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for chunk in response.iter_text():
            chunks.append(chunk)
            if until_end and "event: end\n" in "".join(chunks):
                break
    text = "".join(chunks)
    return text, parse_sse(text)


def check_queued_messages_of_two_tenants_start_in_order(a: httpx.Client, b: httpx.Client) -> None:
    """Two tenants queue messages in conversations of the same id; each tenant's run in order, in its own conversation.

    Each conversation starts with a turn waiting for a form; three messages are queued
    behind it (`if_busy=enqueue`, 202), then the waiting turn is cancelled.
    """
    conversation = f"shared-{uuid.uuid4().hex[:8]}"
    body: dict[str, Any] = {"agent_id": "desk", "conversation_id": conversation}
    active: dict[str, str] = {}
    for name, client in (("a", a), ("b", b)):
        created = client.post("/v1/turns", json={**body, "input": "ticket"})
        assert created.status_code == 201, created.text
        active[name] = created.json()["id"]
        wait_for(client, active[name], blocked)
    for name, client in (("a", a), ("b", b)):
        for i in range(3):
            queued = client.post("/v1/turns", json={**body, "input": f"{name}{i}", "if_busy": "enqueue"})
            assert queued.status_code == 202 and queued.json()["status"] == "QUEUED", queued.text
            assert queued.json()["conversation_id"] == conversation
        assert client.post(f"/v1/turns/{active[name]}/cancel").json()["status"] == "CANCELLED"
    for name, client in (("a", a), ("b", b)):

        def answered(client: httpx.Client = client) -> list[dict[str, Any]] | None:
            turns: list[dict[str, Any]] = client.get("/v1/turns", params={"conversation_id": conversation}).json()[
                "items"
            ]
            return turns if len(turns) == 4 and all(ended(t) for t in turns) else None

        turns = eventually(answered, timeout=30, what=f"the queued messages of tenant {name}")
        outputs = [t["final_output"] for t in sorted(turns, key=lambda t: t["created_at"])][1:]
        assert outputs == [f"echo: {name}{i}" for i in range(3)], outputs
        assert {t["conversation_id"] for t in turns} == {conversation}
        # The tenant's conversation stream has its own three MESSAGE_QUEUED, in line, each
        # before the TURN_STARTED of the turn it names, which links back to the message
        _, events = read_stream(
            client, f"/v1/conversations/{conversation}/events", params={"follow": "false"}, until_end=False
        )
        queued_events = [e["data"] for e in events if e["event"] == "MESSAGE_QUEUED"]
        assert [(q["data"]["content"], q["data"]["ahead"]) for q in queued_events] == [
            (f"{name}{i}", i) for i in range(3)
        ]
        position = {e["data"]["event_id"]: index for index, e in enumerate(events)}
        for queued in queued_events:
            [started] = [
                e["data"] for e in events if e["event"] == "TURN_STARTED" and e["data"]["turn_id"] == queued["turn_id"]
            ]
            assert started["data"]["queued_message_id"] == queued["data"]["message_id"]
            assert position[queued["event_id"]] < position[started["event_id"]]


@dataclass
class CeleryStack:
    """`agent-runner serve` in front of a Celery worker process, on a schema and Redis namespace of one test."""

    cluster: Cluster
    server: ApiServer

    def client(self) -> httpx.Client:
        return self.server.client()


@contextmanager
def api_on_celery(
    pg_url: str,
    tmp_path: Path,
    agents: str = AGENTS,
    *,
    pool: str = "prefork",
    server_args: Sequence[str] = (),
    **env: str,
) -> Iterator[CeleryStack]:
    """Serve `agents` with one Celery worker (`pool`) behind the server; `env` overrides the deployment's settings."""
    with clusters(pg_url, TEST_REDIS_URL, tmp_path) as make:
        cluster = make(AGENT_RUNNER_AGENT_LOADER=agents, **env)
        cluster.start_worker("w1", pool=pool)
        server = ApiServer(agents=agents, env=cluster.env, log=tmp_path / "server.log", args=list(server_args))
        try:
            server.start()
            yield CeleryStack(cluster, server)
        finally:
            server.stop()
