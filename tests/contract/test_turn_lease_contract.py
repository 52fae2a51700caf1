"""The `TurnLease` contract, run against the in-process lease and the SQL lease on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import store
from agent_runner import InMemoryTurnLease, Lease
from agent_runner.persistence import TurnLease


@pytest.fixture
def lease(database_url: str | None) -> Iterator[TurnLease]:
    if database_url is None:
        yield InMemoryTurnLease()
        return
    with store.SqlTurnLease(database_url) as sql_lease:
        yield sql_lease


def test_a_free_lease_is_acquired_and_others_are_kept_out(lease: TurnLease) -> None:
    held = lease.acquire("t-1", "worker-a", 10_000)
    assert held == Lease("t-1", "worker-a", held.fence if held else 0)
    assert lease.acquire("t-1", "worker-b", 10_000) is None
    # Other turns are independent
    assert lease.acquire("t-2", "worker-b", 10_000) is not None


def test_fences_strictly_increase_across_acquisitions(lease: TurnLease) -> None:
    first = lease.acquire("t-1", "worker-a", 10_000)
    assert first is not None and lease.release(first)
    second = lease.acquire("t-1", "worker-b", 10_000)
    assert second is not None and second.fence > first.fence
    # The holder acquiring again gets a new fence, which retires its earlier lease
    third = lease.acquire("t-1", "worker-b", 10_000)
    assert third is not None and third.fence > second.fence
    assert lease.renew(second, 10_000) is False
    assert lease.release(second) is False
    assert lease.renew(third, 10_000) is True


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_refused(lease: TurnLease) -> None:
    old = lease.acquire("t-1", "worker-a", 100)
    assert old is not None
    time.sleep(0.25)
    new = lease.acquire("t-1", "worker-b", 10_000)
    assert new is not None and new.fence > old.fence
    assert lease.renew(old, 10_000) is False
    assert lease.release(old) is False
    assert lease.acquire("t-1", "worker-a", 10_000) is None


def test_renew_extends_only_the_current_holder(lease: TurnLease) -> None:
    held = lease.acquire("t-1", "worker-a", 300)
    assert held is not None
    for _ in range(3):
        time.sleep(0.1)
        assert lease.renew(held, 300)
    # Well past the first TTL, the renewed lease still keeps others out
    assert lease.acquire("t-1", "worker-b", 10_000) is None
    assert lease.renew(Lease("t-1", "worker-b", held.fence), 300) is False
    assert lease.release(Lease("t-1", "worker-a", held.fence + 1)) is False


def test_release_frees_the_lease_once(lease: TurnLease) -> None:
    held = lease.acquire("t-1", "worker-a", 10_000)
    assert held is not None
    assert lease.release(held) is True
    assert lease.release(held) is False
    assert lease.renew(held, 10_000) is False
    assert lease.acquire("t-1", "worker-b", 10_000) is not None
