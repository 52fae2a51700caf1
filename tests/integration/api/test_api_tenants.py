"""Tenants: API keys, and each tenant sees and changes only its own turns and conversations."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import AGENT_RUNNER, ApiServer, server_env
from tests.helpers.processes import REPO_ROOT
from tests.integration.api.api_server import (
    AGENTS,
    assert_error,
    blocked,
    check_queued_messages_of_two_tenants_start_in_order,
    database_state,
    read_stream,
    serve,
    wait_for,
)

pytestmark = pytest.mark.integration

KEYS = "tenant-a:key-a-0123456789, tenant-b:key-b-9876543210"


@pytest.fixture(scope="module")
def database_url(server_dir: Path) -> str:
    return f"sqlite:///{server_dir / 'tenants.db'}"


@pytest.fixture(scope="module")
def server(server_dir: Path, database_url: str) -> Iterator[ApiServer]:
    yield from serve(server_dir, database_url, AGENT_RUNNER_API_KEYS=KEYS)


@pytest.fixture
def a(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client("key-a-0123456789") as client:
        yield client


@pytest.fixture
def b(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client("key-b-9876543210") as client:
        yield client


def start(client: httpx.Client, text: str, chat: str | None = None) -> dict[str, Any]:
    response = client.post("/v1/turns", json={"agent_id": "desk", "input": text, "conversation_id": chat})
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def test_every_v1_route_needs_a_valid_key(server: ApiServer) -> None:
    routes = [
        ("GET", "/v1/turns", None),
        ("GET", "/v1/turns/any", None),
        ("POST", "/v1/turns", {"agent_id": "desk", "input": "hi"}),
        ("POST", "/v1/turns/any/resume", {"action": "retry"}),
        ("POST", "/v1/turns/any/cancel", None),
        ("GET", "/v1/conversations/c-1/messages", None),
        ("GET", "/v1/agents", None),
        ("GET", "/v1/turns/any/events", None),
        ("GET", "/v1/conversations/c-1/events", None),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": "Basic a2V5LWEtMDEyMzQ1Njc4OQ=="}):
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as anonymous:
            for method, path, body in routes:
                response = anonymous.request(method, path, json=body)
                error = assert_error(response, 401, "Unauthorized")
                assert response.headers["WWW-Authenticate"] == "Bearer", (method, path)
                assert "key" in error["message"]
    # The probes and the docs stay open
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/openapi.json").status_code == 200


def test_another_tenants_turn_is_404_everywhere_and_nothing_changes(
    a: httpx.Client, b: httpx.Client, database_url: str
) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn = start(a, "ticket", chat)
    waiting = wait_for(a, turn["id"], blocked)
    call = waiting["suspension"]["correlation_id"]
    before = database_state(database_url)
    attempts = [
        b.get(f"/v1/turns/{turn['id']}"),
        b.get(f"/v1/turns/{turn['id']}", params={"messages": "true"}),
        b.post(f"/v1/turns/{turn['id']}/resume", json={"action": "form", "tool_call_id": call, "data": {}}),
        b.post(
            f"/v1/turns/{turn['id']}/resume",
            json={"action": "form", "tool_call_id": call, "data": {"system": "db", "scope": "ONE_USER"}},
        ),
        b.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "mine now"}),
        b.get(f"/v1/turns/{turn['id']}/events", params={"follow": "false"}),
    ]
    for response in attempts:
        error = assert_error(response, 404, "TurnNotFound")
        assert turn["id"] in error["message"]
    # B's listings never show A's turn, whatever the filter
    assert b.get("/v1/turns").json()["items"] == []
    assert b.get("/v1/turns", params={"conversation_id": chat}).json()["items"] == []
    assert b.get(f"/v1/conversations/{chat}/messages").json()["items"] == []
    assert database_state(database_url) == before
    # A still sees and decides its own turn
    assert a.get(f"/v1/turns/{turn['id']}").json()["status"] == "WAITING_FOR_USER"
    listed = a.get("/v1/turns", params={"conversation_id": chat}).json()["items"]
    assert [t["id"] for t in listed] == [turn["id"]]


def test_equal_conversation_ids_of_two_tenants_never_meet(a: httpx.Client, b: httpx.Client) -> None:
    chat = f"shared-{uuid.uuid4().hex[:8]}"
    first = start(a, "ticket", chat)
    wait_for(a, first["id"], blocked)
    # B's conversation of the same id is free: no 409, and its history is its own
    other = start(b, "hello from b", chat)
    assert other["conversation_id"] == chat
    done = wait_for(b, other["id"], blocked)
    assert done["final_output"] == "echo: hello from b"
    b_messages = b.get(f"/v1/conversations/{chat}/messages").json()["items"]
    a_messages = a.get(f"/v1/conversations/{chat}/messages").json()["items"]
    assert [m.get("content") for m in b_messages if m["role"] == "user"] == ["hello from b"]
    assert [m.get("content") for m in a_messages if m["role"] == "user"] == ["ticket"]
    # A's conversation is still busy for A; the 409 names the conversation as A knows it
    busy = a.post("/v1/turns", json={"agent_id": "desk", "input": "x", "conversation_id": chat})
    error = assert_error(busy, 409, "AgentConversationBusyException")
    assert error["active_turn_id"] == first["id"] and "tenant-a" not in error["message"]
    # Conversation ids are shown as each tenant knows them, everywhere
    for client, turn_id in ((a, first["id"]), (b, other["id"])):
        assert client.get(f"/v1/turns/{turn_id}").json()["conversation_id"] == chat
        listed = client.get("/v1/turns").json()["items"]
        assert chat in {t["conversation_id"] for t in listed}
        assert not any("/" in (t["conversation_id"] or "") for t in listed) and "tenant-" not in str(listed)
    # Events show the conversation as the tenant knows it, and only to that tenant
    _, a_events = read_stream(a, f"/v1/conversations/{chat}/events", params={"follow": "false"}, until_end=False)
    _, b_events = read_stream(b, f"/v1/conversations/{chat}/events", params={"follow": "false"}, until_end=False)
    assert a_events and {e["data"]["turn_id"] for e in a_events} == {first["id"]}
    assert b_events and {e["data"]["turn_id"] for e in b_events} == {other["id"]}
    assert {e["data"]["conversation_id"] for e in a_events + b_events} == {chat}
    # Queued messages stay with their tenant as well
    queued = b.post(
        "/v1/turns", json={"agent_id": "desk", "input": "b again", "conversation_id": chat, "if_busy": "enqueue"}
    )
    assert queued.status_code in (201, 202) and queued.json()["conversation_id"] == chat


def test_queued_messages_of_tenants_sharing_a_conversation_id_start_in_order(a: httpx.Client, b: httpx.Client) -> None:
    check_queued_messages_of_two_tenants_start_in_order(a, b)


def test_without_keys_serve_refuses_a_non_loopback_address(tmp_path: Path) -> None:
    env = server_env(f"sqlite:///{tmp_path / 'x.db'}")
    result = subprocess.run(
        [AGENT_RUNNER, "serve", "--agents", AGENTS, "--host", "0.0.0.0", "--port", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "AGENT_RUNNER_API_KEYS" in result.stderr and "0.0.0.0" in result.stderr
    bad_keys = subprocess.run(
        [AGENT_RUNNER, "serve", "--agents", AGENTS, "--port", "1"],
        cwd=REPO_ROOT,
        env={**env, "AGENT_RUNNER_API_KEYS": "bad/tenant:key"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_keys.returncode == 2 and "AGENT_RUNNER_API_KEYS" in bad_keys.stderr
    assert "key" not in bad_keys.stderr.split("AGENT_RUNNER_API_KEYS")[1].split(":")[0]
