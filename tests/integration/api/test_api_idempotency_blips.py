"""Idempotency-Key after a database blip: the connection dies exactly while the first answer is recorded.

A server on PostgreSQL (embedded worker) acts on a keyed POST, and the backend recording
its answer is terminated while that statement waits (a trigger in the test's schema makes
it wait on an advisory lock the test holds). The action has happened and its answer is
not recorded. The same request sent again with the same key must get the first answer,
told from what the action saved, and never act a second time or answer 409 for minutes.
The same lock holds a first request at its recording while its retry comes in: both get
one answer.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import libpq_url
from tests.helpers.api_server import ApiServer
from tests.helpers.pg_backends import killed_while_waiting, waiting_backends
from tests.integration.api.api_server import eventually, serve, wait_for

pytestmark = pytest.mark.integration

Admin = psycopg.Connection[tuple[Any, ...]]
RECORDING = "UPDATE agent_idempotency_keys"
"""How the statement that records an answer starts."""


@pytest.fixture
def server(pg_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    yield from serve(tmp_path, database_url=pg_url, args=["--worker", "embedded"])


@pytest.fixture
def answer_lock(pg_url: str) -> int:
    """An advisory lock that every recording of an answer in this test's schema waits for while it is held."""
    lock = random.randrange(1, 2**31)
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as connection:
        connection.execute(
            "CREATE FUNCTION hold_answers() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock({lock}); RETURN NEW; END $$"
        )
        connection.execute(
            "CREATE TRIGGER hold_answers BEFORE UPDATE ON agent_idempotency_keys FOR EACH ROW "
            "WHEN (NEW.status = 'COMPLETED') EXECUTE FUNCTION hold_answers()"
        )
    return lock


def cut_while_recording(admin: Admin, lock: int, send: Callable[[], httpx.Response]) -> httpx.Response:
    """Send the request; kill the database connection that records its answer, mid-statement."""
    admin.execute("SELECT pg_advisory_lock(%s)", [lock])
    try:
        outcome = killed_while_waiting(
            admin, send, RECORDING, "recording of the answer", blocked_by=admin.info.backend_pid
        )
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", [lock])
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.Response), outcome
    return outcome[0]


def stored_key(admin: Admin, pg_url: str, key: str) -> tuple[str, int | None]:
    with psycopg.connect(libpq_url(pg_url)) as connection:
        row = connection.execute(
            "SELECT status, response_status FROM agent_idempotency_keys WHERE idempotency_key = %s", [key]
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def turns_of(client: httpx.Client, chat: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/v1/turns", params={"conversation_id": chat}).json()["items"]
    return items


def test_each_post_retried_after_its_answer_was_lost_gets_that_answer_and_acts_once(
    server: ApiServer, pg_url: str, admin: Admin, answer_lock: int
) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    start = {"agent_id": "desk", "input": "ticket", "conversation_id": chat}
    with server.client() as client:

        def post(path: str, body: dict[str, Any], key: str) -> httpx.Response:
            return client.post(path, json=body, headers={"Idempotency-Key": key})

        def lost_then_retried(path: str, body: dict[str, Any], key: str) -> tuple[httpx.Response, httpx.Response]:
            first = cut_while_recording(admin, answer_lock, lambda: post(path, body, key))
            retry = post(path, body, key)
            # The retry is answered from what the first request saved, and that answer is
            # now recorded: a third attempt replays it.
            assert retry.headers.get("Idempotent-Replayed") == "true", retry.text
            assert stored_key(admin, pg_url, key) == ("COMPLETED", retry.status_code)
            third = post(path, body, key)
            assert (third.status_code, third.json()) == (retry.status_code, retry.json())
            return first, retry

        # Start: the action happened, so its answer is given (201); the retry gets the same
        # turn, and the conversation has one turn, not a second one nor a 409 busy
        first, retry = lost_then_retried("/v1/turns", start, "start-1")
        assert first.status_code == retry.status_code == 201, (first.text, retry.text)
        turn_id = first.json()["id"]
        assert retry.json()["id"] == turn_id
        assert [t["id"] for t in turns_of(client, chat)] == [turn_id]
        call = wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_USER")["suspension"]["correlation_id"]

        # Start with if_busy=enqueue: one queued message, the same message id in both answers
        later = {**start, "input": "later", "if_busy": "enqueue"}
        first, retry = lost_then_retried("/v1/turns", later, "queue-1")
        assert first.status_code == retry.status_code == 202
        assert retry.json() == first.json() and first.json()["status"] == "QUEUED"

        # Resume: the form is submitted once; the retry gets 202, not a 409 for a stale call
        form = {"action": "form", "tool_call_id": call, "data": {"system": "db", "scope": "ONE_USER"}}
        first, retry = lost_then_retried(f"/v1/turns/{turn_id}/resume", form, "resume-1")
        assert first.status_code == retry.status_code == 202, (first.text, retry.text)
        assert retry.json()["id"] == turn_id
        wait_for(client, turn_id, lambda v: v["status"] == "WAITING_FOR_APPROVAL")
        messages = client.get(f"/v1/turns/{turn_id}", params={"messages": "true"}).json()["messages"]
        assert len([m for m in messages if m.get("tool_call_id") == call]) == 1

        # Cancel: the retry gets 202 with the cancelled turn, not a 409 for an ended turn
        first, retry = lost_then_retried(f"/v1/turns/{turn_id}/cancel", {"reason": "no"}, "cancel-1")
        assert first.status_code == retry.status_code == 202, (first.text, retry.text)
        assert retry.json()["status"] == "CANCELLED"

        # And the queued message ran exactly once, after the cancel freed the conversation
        eventually(lambda: any(t["final_output"] == "echo: later" for t in turns_of(client, chat)), what="echo: later")
        assert len(turns_of(client, chat)) == 2


def test_a_retry_while_the_first_request_is_still_running_gets_the_same_answer(
    server: ApiServer, admin: Admin, answer_lock: int
) -> None:
    chat = f"c-{uuid.uuid4().hex[:8]}"
    body = {"agent_id": "desk", "input": "ticket", "conversation_id": chat}
    with server.client() as client:
        answers: dict[str, httpx.Response] = {}

        def send(name: str) -> None:
            answers[name] = client.post("/v1/turns", json=body, headers={"Idempotency-Key": "start-twice"})

        # Given a first request held while it records its answer, and its retry sent meanwhile
        admin.execute("SELECT pg_advisory_lock(%s)", [answer_lock])
        try:
            first = threading.Thread(target=send, args=("first",))
            first.start()
            [held] = waiting_backends(admin, RECORDING, 1, "first recording", blocked_by=admin.info.backend_pid)
            retry = threading.Thread(target=send, args=("retry",))
            retry.start()
            # The retry found the turn and waits (behind the first) to record the same answer,
            # rather than being told 409 "in use"
            waiting_backends(admin, RECORDING, 1, "retry's recording", blocked_by=held)
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", [answer_lock])
        first.join(timeout=30)
        retry.join(timeout=30)

        # Then both got the first answer, and the conversation has one turn
        assert answers["first"].status_code == answers["retry"].status_code == 201, answers
        assert answers["retry"].json() == answers["first"].json()
        assert answers["retry"].headers.get("Idempotent-Replayed") == "true"
        assert [t["id"] for t in turns_of(client, chat)] == [answers["first"].json()["id"]]


def test_a_lost_refusal_is_given_again_and_recorded_on_retry(
    server: ApiServer, pg_url: str, admin: Admin, answer_lock: int
) -> None:
    with server.client() as client:

        def cancel() -> httpx.Response:
            return client.post("/v1/turns/no-such-turn/cancel", json={}, headers={"Idempotency-Key": "cancel-none"})

        # Given a refusal (404) whose recording was cut
        first = cut_while_recording(admin, answer_lock, cancel)
        assert first.status_code == 404
        # Then the retry is refused the same way, and that answer is recorded for the next one
        retry = cancel()
        assert (retry.status_code, retry.json()) == (404, first.json())
        assert stored_key(admin, pg_url, "cancel-none") == ("COMPLETED", 404)
