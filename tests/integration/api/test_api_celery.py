"""The HTTP API in front of real Celery workers, on PostgreSQL and Redis: `agent-runner serve --worker celery`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_REDIS_URL
from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import (
    AGENTS,
    CeleryStack,
    api_on_celery,
    assert_error,
    blocked,
    check_queued_messages_of_two_tenants_start_in_order,
    ended,
    eventually,
    read_stream,
    status_is,
    wait_for,
)
from tests.integration.celery_workers.celery_cluster import cluster_env, delete_prefix

pytestmark = pytest.mark.integration


TENANT_KEYS = {"tenant-a": "key-a-0123456789", "tenant-b": "key-b-9876543210"}


@pytest.fixture
def stack(pg_url: str, tmp_path: Path) -> Iterator[CeleryStack]:
    """PostgreSQL, Redis, one Celery worker process and the API server, all of this test alone."""
    with api_on_celery(pg_url, tmp_path, AGENT_RUNNER_INBOX_AGENT="desk") as stack:
        yield stack


@pytest.fixture
def tenant_stack(pg_url: str, tmp_path: Path) -> Iterator[CeleryStack]:
    """The same, with the API keys of two tenants."""
    keys = ",".join(f"{tenant}:{key}" for tenant, key in TENANT_KEYS.items())
    with api_on_celery(pg_url, tmp_path, AGENT_RUNNER_INBOX_AGENT="desk", AGENT_RUNNER_API_KEYS=keys) as stack:
        yield stack


def test_start_form_approve_and_answer_through_celery_workers(stack: CeleryStack) -> None:
    with stack.client() as client:
        ready = client.get("/readyz").json()
        assert ready == {"status": "ok", "checks": {"database": "ok", "redis": "ok", "broker": "ok"}}
        created = client.post("/v1/turns", json={"agent_id": "desk", "input": "ticket", "conversation_id": "c-1"})
        assert created.status_code == 201, created.text
        turn_id = created.json()["id"]
        waiting = wait_for(client, turn_id, blocked)
        call = waiting["suspension"]["correlation_id"]
        bad = client.post(f"/v1/turns/{turn_id}/resume", json={"action": "form", "tool_call_id": call, "data": {}})
        assert {d["path"] for d in assert_error(bad, 422)["details"]} == {"/system", "/scope"}
        form = {"action": "form", "tool_call_id": call, "data": {"system": "vpn", "scope": "ONE_USER"}}
        assert client.post(f"/v1/turns/{turn_id}/resume", json=form).status_code == 202
        approval = wait_for(client, turn_id, status_is("WAITING_FOR_APPROVAL"))
        assert approval["suspension"]["tool_call"]["arguments"]["api_token"] == "***"
        approve = {"action": "approve", "tool_call_id": approval["suspension"]["correlation_id"]}
        assert (
            client.post(f"/v1/turns/{turn_id}/resume", json=approve, headers={"Idempotency-Key": "a1"}).status_code
            == 202
        )
        done = wait_for(client, turn_id, blocked)
        assert done["status"] == "COMPLETED" and done["final_output"] == "opened TICKET-vpn-ONE_USER"
        # The retried approval gets its first answer, not a 409
        again = client.post(f"/v1/turns/{turn_id}/resume", json=approve, headers={"Idempotency-Key": "a1"})
        assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
        # Delegation: the child runs on a worker too
        parent = client.post("/v1/turns", json={"agent_id": "desk", "input": "delegate sum it up"}).json()
        assert wait_for(client, parent["id"], ended)["final_output"] == "helper said: echo: sum it up"


def test_busy_conversations_reject_enqueue_and_interrupt_through_celery(stack: CeleryStack) -> None:
    with stack.client() as client:
        active = client.post("/v1/turns", json={"agent_id": "desk", "input": "ticket", "conversation_id": "c-2"}).json()
        wait_for(client, active["id"], blocked)
        body: dict[str, Any] = {"agent_id": "desk", "input": "queued one", "conversation_id": "c-2"}
        error = assert_error(client.post("/v1/turns", json=body), 409, "AgentConversationBusyException")
        assert error["active_turn_id"] == active["id"]
        queued = client.post("/v1/turns", json={**body, "if_busy": "enqueue"})
        assert queued.status_code == 202 and queued.json()["status"] == "QUEUED"
        # Cancelling the active turn frees the conversation; a worker starts the queued message
        assert client.post(f"/v1/turns/{active['id']}/cancel").json()["status"] == "CANCELLED"

        def answered(output: str) -> dict[str, Any] | None:
            turns = client.get("/v1/turns", params={"conversation_id": "c-2"}).json()["items"]
            return next((t for t in turns if t["final_output"] == output), None)

        first = eventually(lambda: answered("echo: queued one"), timeout=30, what="the queued message")
        assert first["agent_id"] == "desk" and first["status"] == "COMPLETED"
        # Interrupt a waiting turn: cancelled with close-out, the new one starts at once
        waiting = client.post("/v1/turns", json={**body, "input": "ticket"}).json()
        wait_for(client, waiting["id"], blocked)
        interrupted = client.post("/v1/turns", json={**body, "input": "stop that", "if_busy": "interrupt"})
        assert interrupted.status_code == 201, interrupted.text
        assert client.get(f"/v1/turns/{waiting['id']}").json()["status"] == "CANCELLED"
        assert wait_for(client, interrupted.json()["id"], blocked)["final_output"] == "echo: stop that"


def test_queued_messages_of_tenants_sharing_a_conversation_id_start_in_order_on_celery_workers(
    tenant_stack: CeleryStack,
) -> None:
    server = tenant_stack.server
    with server.client(TENANT_KEYS["tenant-a"]) as a, server.client(TENANT_KEYS["tenant-b"]) as b:
        check_queued_messages_of_two_tenants_start_in_order(a, b)
    # And no worker dropped a message of a tenant's conversation (nor warned at each turn end)
    logs = tenant_stack.cluster.logs()
    assert "rejected a" not in logs, logs


def test_readiness_names_a_broker_that_does_not_answer(pg_url: str, tmp_path: Path) -> None:
    namespace = f"ar-api-{uuid.uuid4().hex[:10]}"
    env = cluster_env(
        schema_url=pg_url,
        redis_url=TEST_REDIS_URL,
        namespace=namespace,
        broker_url="redis://127.0.0.1:1/0",
        AGENT_RUNNER_AGENT_LOADER=AGENTS,
    )
    server = ApiServer(agents=AGENTS, env=env, log=tmp_path / "server.log")
    server.start()
    try:
        with server.client() as client:
            error = assert_error(client.get("/readyz"), 503, "NotReady")
            assert [d["component"] for d in error["details"]] == ["broker"] and "broker" in error["message"]
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()
        delete_prefix(TEST_REDIS_URL, namespace)


def test_events_stream_from_the_postgresql_log_and_end_with_the_turn(stack: CeleryStack) -> None:
    with stack.client() as client:
        body = {"agent_id": "desk", "input": "ticket", "conversation_id": "c-3"}
        turn_id = client.post("/v1/turns", json=body).json()["id"]
        wait_for(client, turn_id, blocked)
        _, stored = read_stream(client, f"/v1/turns/{turn_id}/events", params={"follow": "false"}, until_end=False)
        types = [e["event"] for e in stored]
        assert types[0] == "TURN_STARTED" and types[-1] == "TURN_SUSPENDED"
        assert all(e["data"]["conversation_id"] == "c-3" for e in stored)
        # A stream resumed after the first event gets the rest, then the end once the turn has ended
        client.post(f"/v1/turns/{turn_id}/cancel")
        _, rest = read_stream(client, f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": stored[0]["id"]})
        assert [e["id"] for e in rest[: len(stored) - 1]] == [e["id"] for e in stored[1:]]
        assert [e["event"] for e in rest[-2:]] == ["TURN_CANCELLED", "end"]
        assert rest[-1]["data"] == {"turn_id": turn_id, "status": "CANCELLED"}
