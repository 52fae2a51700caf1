"""Webhooks from the embedded worker of `agent-runner serve`: every kind once per event, signed, retried, dead-lettered."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from store.webhooks import DeliveryStatus, WebhookDelivery, WebhookDeliveryLog
from tests.helpers.api_server import ApiServer
from tests.helpers.webhook_receiver import WebhookReceiver, fail_by_conversation, webhook_env, webhook_receiver
from tests.integration.api.api_server import blocked, serve, status_is, wait_for

SECRET = "whsec-embedded-test"


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as running:
        running.answer = fail_by_conversation
        yield running


@pytest.fixture(scope="module")
def server(server_dir: Path, receiver: WebhookReceiver) -> Iterator[ApiServer]:
    yield from serve(server_dir, None, None, **webhook_env(receiver, SECRET))


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def _start(client: httpx.Client, text: str, conversation: str) -> str:
    response = client.post("/v1/turns", json={"agent_id": "desk", "input": text, "conversation_id": conversation})
    assert response.status_code == 201, response.text
    turn_id: str = response.json()["id"]
    return turn_id


def _resume(client: httpx.Client, turn_id: str, **body: Any) -> None:
    response = client.post(f"/v1/turns/{turn_id}/resume", json=body)
    assert response.status_code == 202, response.text


def _deliveries(server_dir: Path) -> WebhookDeliveryLog:
    return WebhookDeliveryLog(f"sqlite:///{server_dir / 'api.db'}")


def test_each_kind_of_webhook_arrives_once_per_event_and_signed(
    client: httpx.Client, receiver: WebhookReceiver
) -> None:
    # Given: a ticket turn that waits for a form, then for an approval, then completes
    chat = f"c-{uuid.uuid4().hex[:8]}"
    turn_id = _start(client, "ticket please", chat)
    form = wait_for(client, turn_id, blocked)
    receiver.wait_for(lambda: len(receiver.of_turn(turn_id)) == 1, "the form's waiting webhook")
    _resume(
        client,
        turn_id,
        action="form",
        tool_call_id=form["suspension"]["correlation_id"],
        data={"system": "login", "scope": "ONE_USER"},
    )
    approval = wait_for(client, turn_id, status_is("WAITING_FOR_APPROVAL"))
    receiver.wait_for(lambda: len(receiver.of_turn(turn_id)) == 2, "the approval's waiting webhook")
    _resume(client, turn_id, action="approve", tool_call_id=approval["suspension"]["correlation_id"])
    wait_for(client, turn_id, status_is("COMPLETED"))
    # And: a turn that fails, and one cancelled while it waits
    failing = _start(client, "fail on purpose", f"c-{uuid.uuid4().hex[:8]}")
    cancelled = _start(client, "ticket to cancel", f"c-{uuid.uuid4().hex[:8]}")
    wait_for(client, cancelled, blocked)
    assert client.post(f"/v1/turns/{cancelled}/cancel", json={}).status_code == 202
    # Then: each event arrives at its kind's URL
    receiver.wait_for(lambda: len(receiver.of_turn(turn_id)) == 3, "the ended webhook")
    receiver.wait_for(lambda: len(receiver.of_turn(failing)) == 1, "the failed webhook")
    receiver.wait_for(lambda: len(receiver.of_turn(cancelled)) == 2, "the cancelled turn's webhooks")
    time.sleep(1.0)  # ten more delivery rounds: none of them may send an event again
    ticket = receiver.of_turn(turn_id)
    assert [(r.path, r.payload["event"]["type"]) for r in ticket] == [
        ("/waiting", "TURN_SUSPENDED"),
        ("/waiting", "TURN_SUSPENDED"),
        ("/ended", "TURN_COMPLETED"),
    ]
    assert [r.payload["event"]["data"]["suspension_type"] for r in ticket[:2]] == ["USER_INPUT", "TOOL_APPROVAL"]
    assert [(r.path, r.payload["event"]["type"]) for r in receiver.of_turn(failing)] == [("/failed", "TURN_FAILED")]
    assert [r.path for r in receiver.of_turn(cancelled)] == ["/waiting", "/ended"]
    everything = ticket + receiver.of_turn(failing) + receiver.of_turn(cancelled)
    assert len({r.delivery_id for r in everything}) == len(everything)
    for received in everything:
        # Signed over timestamp and body with the shared secret; the delivery id is the event id
        assert received.signature_is_valid(SECRET)
        assert not received.signature_is_valid("another-secret")
        assert received.delivery_id == received.payload["delivery_id"] == received.payload["event"]["event_id"]
        assert received.headers["x-agent-runner-webhook"] == received.path.strip("/")
        assert received.payload["event"]["agent_id"] == "desk"
    assert ticket[0].payload["event"]["conversation_id"] == chat


def test_a_delivery_answered_500_is_retried_with_the_same_delivery_id(
    client: httpx.Client, receiver: WebhookReceiver, server_dir: Path
) -> None:
    # Given: a receiver that answers the first attempt of each delivery with a 500
    turn_id = _start(client, "hello", f"flaky-{uuid.uuid4().hex[:8]}")
    # Then: the second attempt delivers the same body with the same delivery id
    receiver.wait_for(lambda: [r.status for r in receiver.of_turn(turn_id)] == [500, 200], "the retried delivery")
    first, second = receiver.of_turn(turn_id)
    assert first.delivery_id == second.delivery_id and first.body == second.body
    assert second.signature_is_valid(SECRET)
    with _deliveries(server_dir) as log:
        delivery = log.get(first.delivery_id)
    assert delivery is not None
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (DeliveryStatus.DELIVERED, 2, 200)


def test_a_delivery_that_keeps_failing_is_dead_lettered_after_the_last_attempt(
    client: httpx.Client, receiver: WebhookReceiver, server_dir: Path
) -> None:
    # Given: a receiver that always answers 500 (three attempts are configured)
    turn_id = _start(client, "hello", f"dead-{uuid.uuid4().hex[:8]}")
    receiver.wait_for(lambda: len(receiver.of_turn(turn_id)) == 3, "three attempts")
    event_id = receiver.of_turn(turn_id)[0].delivery_id
    # Then: the delivery is recorded dead, with the last error, and is not tried again

    def dead() -> WebhookDelivery | None:
        with _deliveries(server_dir) as log:
            found = log.get(event_id)
        return found if found is not None and found.status is DeliveryStatus.DEAD else None

    receiver.wait_for(lambda: dead() is not None, "the dead letter")
    letter = dead()
    assert letter is not None
    assert (letter.attempts, letter.last_status_code, letter.last_error) == (3, 500, "HTTP 500")
    assert letter.url.endswith("/ended") and letter.body["event"]["type"] == "TURN_COMPLETED"
    with _deliveries(server_dir) as log:
        assert event_id in [d.event_id for d in log.list_deliveries(DeliveryStatus.DEAD)]
    time.sleep(0.5)
    assert len(receiver.of_turn(turn_id)) == 3
