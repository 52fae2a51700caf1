"""Idempotency keys on SQLite and PostgreSQL: one claim per tenant and key, the first answer recorded kept."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from agent_runner import AgentEvent, AgentEventType
from agent_runner.ids import utcnow
from store import IdempotencyKeys, IdempotencyStatus, SqlAgentTurnStore
from store.idempotency import RESUME_MARK
from tests.integration.store.store_kit import step, turn_with_history


@pytest.fixture
def keys(sql_url: str) -> Iterator[IdempotencyKeys]:
    with IdempotencyKeys(sql_url) as store:
        yield store


def test_the_first_claim_wins_and_later_ones_read_the_recorded_answer(keys: IdempotencyKeys) -> None:
    # Given a claimed key, a second claim sees it in progress
    assert keys.claim("tenant-a", "k-1", "f1") is None
    running = keys.claim("tenant-a", "k-1", "f1")
    assert running is not None and running.status is IdempotencyStatus.IN_PROGRESS and running.response_status is None
    # When the first request records its answer, then every later claim returns it
    recorded = keys.complete("tenant-a", "k-1", 201, {"id": "turn-1", "nested": {"ok": True}})
    assert recorded is not None and recorded.status is IdempotencyStatus.COMPLETED
    done = keys.claim("tenant-a", "k-1", "f1")
    assert done is not None and done.status is IdempotencyStatus.COMPLETED
    assert (done.response_status, done.response_body, done.fingerprint) == (
        201,
        {"id": "turn-1", "nested": {"ok": True}},
        "f1",
    )
    # And the fingerprint of the first request is kept for the caller to compare
    other = keys.claim("tenant-a", "k-1", "another-request")
    assert other is not None and other.fingerprint == "f1"


def test_keys_are_scoped_per_tenant(keys: IdempotencyKeys) -> None:
    assert keys.claim("tenant-a", "same", "f") is None
    assert keys.claim("tenant-b", "same", "f") is None
    assert keys.claim(None, "same", "f") is None
    keys.complete("tenant-b", "same", 202, {"b": 1})
    a, b, none = keys.get("tenant-a", "same"), keys.get("tenant-b", "same"), keys.get(None, "same")
    assert a is not None and a.status is IdempotencyStatus.IN_PROGRESS
    assert b is not None and b.response_body == {"b": 1} and b.tenant_id == "tenant-b"
    assert none is not None and none.tenant_id is None and none.status is IdempotencyStatus.IN_PROGRESS


def test_the_first_recorded_answer_stays_and_is_what_a_later_recording_returns(keys: IdempotencyKeys) -> None:
    # Given a claim left unanswered (its request died, or could not record its answer)
    assert keys.claim("t", "k", "f") is None
    unanswered = keys.claim("t", "k", "f")
    assert unanswered is not None and unanswered.status is IdempotencyStatus.IN_PROGRESS
    # When a retry records its answer, and then the first request records another
    first = keys.complete("t", "k", 201, {"id": "turn-1"})
    second = keys.complete("t", "k", 409, {"error": {"type": "X"}})
    # Then both recordings return the first answer, which is the one kept
    assert first is not None and second is not None
    assert (first.response_status, first.response_body) == (second.response_status, second.response_body)
    assert (second.response_status, second.response_body) == (201, {"id": "turn-1"})
    kept = keys.get("t", "k")
    assert kept is not None and kept.status is IdempotencyStatus.COMPLETED and kept.response_status == 201


def test_recording_for_a_key_no_longer_stored_records_nothing(keys: IdempotencyKeys) -> None:
    assert keys.complete("t", "purged", 201, {"id": "turn-1"}) is None
    assert keys.get("t", "purged") is None


def test_a_resume_is_found_by_the_mark_its_command_metadata_carries(sql_url: str, keys: IdempotencyKeys) -> None:
    # Given a turn resumed by a command marked r-1, and another turn never resumed
    with SqlAgentTurnStore(sql_url) as turns:
        created = turns.save(turn_with_history("t-1", 1), -1)
        data = {"command": "approve_tool", "tool_call_id": "c-1", "metadata": {"channel": "http", RESUME_MARK: "r-1"}}
        resumed = AgentEvent(
            event_id="t-1:1:0", type=AgentEventType.TURN_RESUMED, turn_id="t-1", root_turn_id="t-1", data=data
        )
        turn = turns.save(step(created), 0, [resumed])
        other = turns.save(turn_with_history("t-2", 1), -1)
    # Then the mark is found on its turn only, and another mark is not
    assert keys.is_resume_applied(turn, "r-1") is True
    assert keys.is_resume_applied(turn, "r-2") is False
    assert keys.is_resume_applied(other, "r-1") is False


def test_purge_deletes_old_keys(keys: IdempotencyKeys) -> None:
    assert keys.claim("t", "old", "f") is None
    assert keys.purge(utcnow() - timedelta(hours=1)) == 0
    assert keys.purge(utcnow() + timedelta(seconds=1)) == 1
    assert keys.get("t", "old") is None
