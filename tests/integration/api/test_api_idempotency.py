"""Idempotency-Key: a retried POST returns the first answer and acts once, also after the server restarts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import assert_error, blocked, eventually, serve, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    yield from serve(tmp_path)


def turns_of(client: httpx.Client, chat: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/v1/turns", params={"conversation_id": chat}).json()["items"]
    return items


def test_retried_posts_return_the_first_answer_and_act_once_also_after_a_restart(server: ApiServer) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    body = {"agent_id": "desk", "input": "ticket", "conversation_id": chat}
    with server.client() as client:
        # Start: the retry gets the same 201 and body, and no second turn (nor a 409 busy)
        first = client.post("/v1/turns", json=body, headers={"Idempotency-Key": "start-1"})
        again = client.post("/v1/turns", json=body, headers={"Idempotency-Key": "start-1"})
        assert first.status_code == again.status_code == 201
        assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
        assert len(turns_of(client, chat)) == 1
        turn_id = first.json()["id"]
        call = wait_for(client, turn_id, blocked)["suspension"]["correlation_id"]
        # The same key with a different body (or on another route) is a 422, and acts not
        changed = client.post("/v1/turns", json={**body, "input": "other"}, headers={"Idempotency-Key": "start-1"})
        assert_error(changed, 422, "IdempotencyKeyReused")
        elsewhere = client.post(f"/v1/turns/{turn_id}/cancel", headers={"Idempotency-Key": "start-1"})
        assert_error(elsewhere, 422, "IdempotencyKeyReused")
        assert client.get(f"/v1/turns/{turn_id}").json()["status"] == "WAITING_FOR_USER"
        # A refused answer is kept too: the retry of a 409 is the same 409
        busy = client.post("/v1/turns", json={**body, "input": "x"}, headers={"Idempotency-Key": "busy-1"})
        assert_error(busy, 409, "AgentConversationBusyException")
        # Enqueue: one queued message however often it is retried
        queued_body = {**body, "input": "later", "if_busy": "enqueue"}
        queued = client.post("/v1/turns", json=queued_body, headers={"Idempotency-Key": "queue-1"})
        assert queued.status_code == 202
        # Resume
        form = {"action": "form", "tool_call_id": call, "data": {"system": "db", "scope": "ONE_USER"}}
        resumed = client.post(f"/v1/turns/{turn_id}/resume", json=form, headers={"Idempotency-Key": "resume-1"})
        assert resumed.status_code == 202
        waiting = wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_APPROVAL")
    # When the server restarts (same database), every retry still gets its first answer
    server.restart()
    with server.client() as client:
        replay = client.post("/v1/turns", json=body, headers={"Idempotency-Key": "start-1"})
        assert (replay.status_code, replay.json()) == (201, first.json())
        busy_again = client.post("/v1/turns", json={**body, "input": "x"}, headers={"Idempotency-Key": "busy-1"})
        assert (busy_again.status_code, busy_again.json()) == (409, busy.json())
        queued_again = client.post("/v1/turns", json=queued_body, headers={"Idempotency-Key": "queue-1"})
        assert (queued_again.status_code, queued_again.json()) == (202, queued.json())
        resumed_again = client.post(f"/v1/turns/{turn_id}/resume", json=form, headers={"Idempotency-Key": "resume-1"})
        assert (resumed_again.status_code, resumed_again.json()) == (202, resumed.json())
        # The turn went on once: no second form submission, no 409 for the retried decision
        assert client.get(f"/v1/turns/{turn_id}").json()["version"] == waiting["version"]
        # Cancel, retried: the same 202 (not a 409 for an ended turn)
        cancel = client.post(f"/v1/turns/{turn_id}/cancel", json={"reason": "no"}, headers={"Idempotency-Key": "c-1"})
        cancel_again = client.post(
            f"/v1/turns/{turn_id}/cancel", json={"reason": "no"}, headers={"Idempotency-Key": "c-1"}
        )
        assert cancel.status_code == cancel_again.status_code == 202 and cancel.json() == cancel_again.json()
        # The queued message ran once, after the cancel freed the conversation
        later = wait_for_output(client, chat, "echo: later")
        assert len([t for t in turns_of(client, chat) if t["final_output"] == "echo: later"]) == 1
        assert later["conversation_id"] == chat


def wait_for_output(client: httpx.Client, chat: str, output: str) -> dict[str, Any]:
    found: dict[str, Any] = eventually(
        lambda: next((t for t in turns_of(client, chat) if t["final_output"] == output), None), what=output
    )
    return found


def test_keys_must_be_printable_and_short(server: ApiServer) -> None:
    with server.client() as client:
        body = {"agent_id": "desk", "input": "hi"}
        assert_error(client.post("/v1/turns", json=body, headers={"Idempotency-Key": "k" * 256}), 422)
        assert_error(client.post("/v1/turns", json=body, headers={"Idempotency-Key": "has space"}), 422)
        assert client.get("/v1/turns").json()["items"] == []
