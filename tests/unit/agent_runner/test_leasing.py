"""`LeaseKeeper`: the one lease heartbeat of both workers."""

from __future__ import annotations

import threading
import time

import pytest

from agent_runner import InMemoryTurnLease, Lease, LeaseKeeper, StoreUnavailableError


class FlakyLease(InMemoryTurnLease):
    """An in-process lease whose renewals can be made to fail like an unreachable backend."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.renewals = 0

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        self.renewals += 1
        if self.down:
            raise StoreUnavailableError("lease backend unreachable")
        return super().renew(lease, ttl_ms)


def wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_a_held_lease_is_renewed_past_its_ttl_and_stays_safe() -> None:
    lease = FlakyLease()
    keeper = LeaseKeeper(lease, ttl_ms=150)
    held = keeper.acquire("t-1", "me")
    assert held is not None and held.fence == 1
    time.sleep(0.5)  # more than three TTLs: only renewals keep it
    assert lease.renewals >= 3
    assert keeper.may_step(held)
    assert lease.acquire("t-1", "someone-else", 150) is None
    keeper.release(held)
    assert lease.acquire("t-1", "someone-else", 150) is not None


def test_a_lease_taken_over_is_marked_lost_and_stops_further_steps() -> None:
    lease = FlakyLease()
    keeper = LeaseKeeper(lease, ttl_ms=150)
    held = keeper.acquire("t-1", "me")
    assert held is not None
    lease.down = True  # renewals fail: the lease runs out
    time.sleep(0.2)
    lease.down = False
    taken = lease.acquire("t-1", "other", 10_000)
    assert taken is not None and taken.fence == 2
    wait_until(lambda: held.lost)
    assert not keeper.may_step(held)
    keeper.release(held)  # releasing a lost lease neither raises nor frees the new holder's
    assert lease.acquire("t-1", "third", 150) is None


def test_a_lease_not_renewed_for_two_thirds_of_its_ttl_is_not_safe_to_step() -> None:
    lease = FlakyLease()
    keeper = LeaseKeeper(lease, ttl_ms=300)
    held = keeper.acquire("t-1", "me")
    assert held is not None
    lease.down = True
    wait_until(lambda: not keeper.may_step(held), timeout=2.0)
    assert not held.lost  # not refused, just unconfirmed: the backend may come back
    keeper.release(held)


def test_the_heartbeat_thread_ends_when_nothing_is_held_and_restarts_on_demand() -> None:
    keeper = LeaseKeeper(InMemoryTurnLease(), ttl_ms=90, name="keeper-under-test")

    def heartbeats() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "keeper-under-test-heartbeat")

    held = keeper.acquire("t-1", "me")
    assert held is not None and heartbeats() == 1
    keeper.release(held)
    wait_until(lambda: heartbeats() == 0)
    again = keeper.acquire("t-2", "me")
    assert again is not None and heartbeats() == 1
    keeper.release(again)
    keeper.stop()
    assert heartbeats() == 0


def test_a_refused_acquire_returns_none_and_holds_nothing() -> None:
    lease = InMemoryTurnLease()
    assert lease.acquire("t-1", "other", 10_000) is not None
    keeper = LeaseKeeper(lease, ttl_ms=10_000)
    assert keeper.acquire("t-1", "me") is None
    assert keeper.held == 0


def test_the_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        LeaseKeeper(InMemoryTurnLease(), ttl_ms=0)
