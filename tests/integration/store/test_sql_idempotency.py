"""Idempotency keys on SQLite and PostgreSQL: one claim per tenant and key, answers kept, stale claims taken over."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from agent_runner._base import utcnow
from store import IdempotencyKeys, IdempotencyStatus

FRESH = timedelta(minutes=5)


@pytest.fixture
def keys(sql_url: str) -> Iterator[IdempotencyKeys]:
    with IdempotencyKeys(sql_url) as store:
        yield store


def test_the_first_claim_wins_and_later_ones_read_the_recorded_answer(keys: IdempotencyKeys) -> None:
    # Given a claimed key, a second claim sees it in progress
    assert keys.claim("tenant-a", "k-1", "f1", stale_after=FRESH) is None
    running = keys.claim("tenant-a", "k-1", "f1", stale_after=FRESH)
    assert running is not None and running.status is IdempotencyStatus.IN_PROGRESS and running.response_status is None
    # When the first request records its answer, then every later claim returns it
    keys.complete("tenant-a", "k-1", 201, {"id": "turn-1", "nested": {"ok": True}})
    done = keys.claim("tenant-a", "k-1", "f1", stale_after=FRESH)
    assert done is not None and done.status is IdempotencyStatus.COMPLETED
    assert (done.response_status, done.response_body, done.fingerprint) == (
        201,
        {"id": "turn-1", "nested": {"ok": True}},
        "f1",
    )
    # And the fingerprint of the first request is kept for the caller to compare
    other = keys.claim("tenant-a", "k-1", "another-request", stale_after=FRESH)
    assert other is not None and other.fingerprint == "f1"


def test_keys_are_scoped_per_tenant(keys: IdempotencyKeys) -> None:
    assert keys.claim("tenant-a", "same", "f", stale_after=FRESH) is None
    assert keys.claim("tenant-b", "same", "f", stale_after=FRESH) is None
    assert keys.claim(None, "same", "f", stale_after=FRESH) is None
    keys.complete("tenant-b", "same", 202, {"b": 1})
    a, b, none = keys.get("tenant-a", "same"), keys.get("tenant-b", "same"), keys.get(None, "same")
    assert a is not None and a.status is IdempotencyStatus.IN_PROGRESS
    assert b is not None and b.response_body == {"b": 1} and b.tenant_id == "tenant-b"
    assert none is not None and none.tenant_id is None and none.status is IdempotencyStatus.IN_PROGRESS


def test_an_abandoned_claim_can_be_claimed_again_but_an_answer_stays(keys: IdempotencyKeys) -> None:
    assert keys.claim("t", "k", "f", stale_after=FRESH) is None
    keys.abandon("t", "k")
    assert keys.get("t", "k") is None
    assert keys.claim("t", "k", "f", stale_after=FRESH) is None
    keys.complete("t", "k", 409, {"error": {"type": "X"}})
    keys.abandon("t", "k")  # a completed answer is never released
    kept = keys.get("t", "k")
    assert kept is not None and kept.response_status == 409


def test_a_stale_claim_of_the_same_request_is_taken_over(keys: IdempotencyKeys) -> None:
    assert keys.claim("t", "k", "f", stale_after=FRESH) is None
    # A claim older than stale_after (its request died) is taken over by the same request only
    assert keys.claim("t", "k", "other", stale_after=timedelta(0)) is not None
    assert keys.claim("t", "k", "f", stale_after=timedelta(0)) is None
    assert keys.claim("t", "k", "f", stale_after=FRESH) is not None


def test_purge_deletes_old_keys(keys: IdempotencyKeys) -> None:
    assert keys.claim("t", "old", "f", stale_after=FRESH) is None
    assert keys.purge(utcnow() - timedelta(hours=1)) == 0
    assert keys.purge(utcnow() + timedelta(seconds=1)) == 1
    assert keys.get("t", "old") is None
