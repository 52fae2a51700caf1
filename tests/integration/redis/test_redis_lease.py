"""RedisTurnLease against a real Redis: mutual exclusion across processes, fencing, expiry."""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any, TypedDict

import pytest
from redis import Redis

from agent_runner.persistence import Lease, TurnLease
from store.keys import RedisKeys
from store.redis_lease import RedisTurnLease

pytestmark = pytest.mark.integration

CONTENDERS = 8
CONTENTION_S = 3.0
CONTENTION_TTL_MS = 150
ABANDON_EVERY = 10
"""Every tenth acquisition of a contender is left to expire, as if its worker had died."""


class ContenderReport(TypedDict):
    owner: str
    fences: list[int]
    """Fence of every acquisition, in this contender's order."""
    intervals: list[tuple[int, int, int]]
    """(fence, start_ns, end_ns) in `time.monotonic_ns()`: when the contender believed it held that lease."""
    stolen: int
    """Renewals refused while the lease could not have expired yet: someone took a live lease."""
    abandoned: int
    error: str | None


def _contend(redis_url: str, prefix: str, turn_id: str, name: str, barrier: Any, results: Any, seed: int) -> None:
    """Acquire, work under, renew and release one lease over and over until the time is up.

    A holder believes it holds the lease from the reply to `acquire` until whichever comes
    first: the moment it releases (or dies), or its deadline, the TTL counted from before it
    sent the last `acquire` or `renew` that succeeded. Redis counts the same TTL from when
    it runs the script, which is later, so the lease cannot expire before the deadline:
    two beliefs may only overlap if the lease let someone in early. A holder stops writing
    as soon as its deadline passes or a renew fails. The monotonic clock is system-wide,
    so the intervals of different processes compare.
    """
    rng = random.Random(seed)
    report: ContenderReport = {
        "owner": name,
        "fences": [],
        "intervals": [],
        "stolen": 0,
        "abandoned": 0,
        "error": None,
    }
    ttl_ns = CONTENTION_TTL_MS * 1_000_000
    generation = 0
    turn_lease = RedisTurnLease(redis_url, prefix=prefix)
    try:
        barrier.wait(timeout=60)
        stop_at = time.monotonic() + CONTENTION_S
        while time.monotonic() < stop_at:
            owner = f"{name}/{generation}"
            sent = time.monotonic_ns()
            lease = turn_lease.acquire(turn_id, owner, CONTENTION_TTL_MS)
            if lease is None:
                time.sleep(rng.uniform(0, 0.002))
                continue
            start, deadline = time.monotonic_ns(), sent + ttl_ns
            report["fences"].append(lease.fence)
            for _ in range(rng.randint(1, 3)):
                time.sleep(rng.uniform(0.0005, 0.003))  # the work done under the lease
                sent = time.monotonic_ns()
                if sent >= deadline:
                    break
                if not turn_lease.renew(lease, CONTENTION_TTL_MS):
                    if time.monotonic_ns() < deadline:
                        report["stolen"] += 1
                    break
                deadline = sent + ttl_ns
            end = min(time.monotonic_ns(), deadline)
            if end > start:
                report["intervals"].append((lease.fence, start, end))
            if len(report["fences"]) % ABANDON_EVERY == 0:
                # A crashed worker never releases, and its replacement has a new owner token.
                report["abandoned"] += 1
                generation += 1
                continue
            turn_lease.release(lease)
    except BaseException as exc:  # reported to the parent, which fails the test with it
        report["error"] = repr(exc)
    finally:
        turn_lease.close()
        results.put(report)


def _run_contenders(redis_url: str, prefix: str, turn_id: str) -> list[ContenderReport]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CONTENDERS)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=_contend,
            args=(redis_url, prefix, turn_id, f"contender-{index}", barrier, results, index),
            name=f"lease-contender-{index}",
        )
        for index in range(CONTENDERS)
    ]
    for process in processes:
        process.start()
    try:
        # Read before joining: a child blocks on exit until its queued report is read.
        return [results.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
            process.close()
        results.close()
        results.join_thread()


def test_eight_processes_never_hold_one_lease_at_once(
    redis_url: str, redis_client: Redis[Any], keys: RedisKeys
) -> None:
    # Given 8 processes that compete for one turn's lease for about 3 seconds, some of
    # which abandon it and leave it to expire
    reports = _run_contenders(redis_url, keys.prefix, "contended-turn")

    # Then none of them failed
    assert [r["error"] for r in reports if r["error"]] == []

    # And there was real contention, with hand-offs by release and by expiry
    fences = sorted(fence for r in reports for fence in r["fences"])
    intervals = sorted((start, end, fence) for r in reports for fence, start, end in r["intervals"])
    assert len(fences) >= 30
    assert sum(1 for r in reports if r["fences"]) >= 2
    assert sum(r["abandoned"] for r in reports) >= 1

    # And no holder's lease was taken while it was live, and no two holders overlapped
    assert sum(r["stolen"] for r in reports) == 0
    held_until, held_fence = 0, 0
    for start, end, fence in intervals:
        assert held_until <= start, f"fence {held_fence} was still held when fence {fence} began"
        if end > held_until:
            held_until, held_fence = end, fence

    # And fences strictly increase in acquisition order
    in_order = [fence for _, _, fence in intervals]
    assert in_order == sorted(set(in_order))

    # And every acquisition took its own fence from the counter: consecutive, none lost or repeated
    assert fences == list(range(fences[0], fences[0] + len(fences)))
    assert int(redis_client.get(keys.turn_fence("contended-turn")) or 0) == fences[-1]


def test_the_lease_satisfies_the_turn_lease_protocol(lease: RedisTurnLease) -> None:
    assert isinstance(lease, TurnLease)


def test_renew_and_release_by_another_owner_or_a_stale_fence_fail(lease: RedisTurnLease) -> None:
    # Given a lease held by worker-a
    held = lease.acquire("turn-1", "worker-a", 5_000)
    assert held is not None and (held.turn_id, held.owner) == ("turn-1", "worker-a")
    f = held.fence

    # When another owner, or the right owner with another fence, tries to renew or release
    impostors = [Lease("turn-1", "worker-b", f), Lease("turn-1", "worker-a", f - 1), Lease("turn-1", "worker-a", f + 1)]

    # Then every attempt fails and worker-a still holds the lease
    for impostor in impostors:
        assert lease.renew(impostor, 5_000) is False
        assert lease.release(impostor) is False
    assert lease.acquire("turn-1", "worker-b", 5_000) is None
    assert lease.holder("turn-1") == held

    # And the owner itself can renew and release it, once
    assert lease.renew(held, 5_000) is True
    assert lease.release(held) is True
    assert lease.release(held) is False
    assert lease.renew(held, 5_000) is False
    assert lease.holder("turn-1") is None


def test_an_expired_lease_is_free_for_another_owner(lease: RedisTurnLease) -> None:
    # Given a lease with a 100 ms TTL that its owner never renews
    first = lease.acquire("turn-1", "worker-a", 100)
    assert first is not None

    # When the TTL has passed
    time.sleep(0.15)

    # Then another owner takes it, with the next fence
    assert lease.holder("turn-1") is None
    assert lease.acquire("turn-1", "worker-b", 5_000) == Lease("turn-1", "worker-b", first.fence + 1)


def test_a_stale_holder_cannot_renew_or_release_after_another_owner_took_over(lease: RedisTurnLease) -> None:
    # Given worker-a's lease expired while it was paused, and worker-b took the turn over
    stale = lease.acquire("turn-1", "worker-a", 100)
    assert stale is not None
    time.sleep(0.2)
    current = lease.acquire("turn-1", "worker-b", 5_000)
    assert current == Lease("turn-1", "worker-b", stale.fence + 1)

    # When worker-a wakes up and tries to carry on
    renewed = lease.renew(stale, 5_000)
    released = lease.release(stale)

    # Then it is refused, and worker-b's lease is untouched
    assert renewed is False
    assert released is False
    assert lease.holder("turn-1") == current
    assert lease.renew(current, 5_000) is True


def test_an_expired_lease_cannot_be_revived_by_its_owner(lease: RedisTurnLease) -> None:
    # Given a lease that expired with nobody taking it since
    stale = lease.acquire("turn-1", "worker-a", 100)
    assert stale is not None
    time.sleep(0.15)

    # Then renewing it fails: another worker may be about to take it
    assert lease.renew(stale, 5_000) is False
    assert lease.release(stale) is False


def test_renew_keeps_the_lease_past_its_first_ttl(lease: RedisTurnLease) -> None:
    # Given a 500 ms lease renewed for 3 s before it ran out
    held = lease.acquire("turn-1", "worker-a", 500)
    assert held is not None
    time.sleep(0.1)
    assert lease.renew(held, 3_000) is True

    # When the first TTL has passed
    time.sleep(0.5)

    # Then the owner still holds it
    assert lease.acquire("turn-1", "worker-b", 5_000) is None
    assert lease.holder("turn-1") == held


def test_the_fence_keeps_increasing_across_release_and_expiry(lease: RedisTurnLease) -> None:
    # Given a lease acquired and released, then acquired and left to expire
    first = lease.acquire("turn-1", "worker-a", 5_000)
    assert first is not None and lease.release(first)
    second = lease.acquire("turn-1", "worker-b", 100)
    assert second is not None
    time.sleep(0.15)

    # When it is acquired again
    third = lease.acquire("turn-1", "worker-c", 5_000)

    # Then each acquisition had a higher fence, and other turns count on their own
    assert third is not None
    assert second.fence == first.fence + 1 and third.fence == first.fence + 2
    other_turn = lease.acquire("turn-2", "worker-a", 5_000)
    assert other_turn is not None and other_turn.fence != third.fence + 1


def test_acquiring_again_as_the_same_owner_retires_the_older_lease(lease: RedisTurnLease) -> None:
    # Given an owner that acquires a lease it already holds
    older = lease.acquire("turn-1", "worker-a", 5_000)
    newer = lease.acquire("turn-1", "worker-a", 5_000)

    # Then it gets a new fence, and only the newer Lease counts
    assert older is not None and newer is not None
    assert newer.fence == older.fence + 1
    assert lease.renew(older, 5_000) is False
    assert lease.release(older) is False
    assert lease.release(newer) is True


def test_leases_in_different_namespaces_do_not_meet(
    redis_url: str, redis_client: Redis[Any], lease: RedisTurnLease, keys: RedisKeys
) -> None:
    # Given a turn leased in this test's namespace
    assert lease.acquire("turn-1", "worker-a", 5_000) is not None

    # Then the same turn id is free under another prefix
    other = RedisKeys(f"{keys.prefix}-other")
    try:
        with RedisTurnLease(redis_url, prefix=other.prefix) as other_lease:
            taken = other_lease.acquire("turn-1", "worker-b", 5_000)
            assert taken is not None and taken.owner == "worker-b"
    finally:
        redis_client.delete(other.turn_lease("turn-1"), other.turn_fence("turn-1"))


@pytest.mark.parametrize("ttl_ms", [0, -5])
def test_a_ttl_that_is_not_positive_is_rejected(lease: RedisTurnLease, ttl_ms: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        lease.acquire("turn-1", "worker-a", ttl_ms)
    with pytest.raises(ValueError, match="positive"):
        lease.renew(Lease("turn-1", "worker-a", 1), ttl_ms)
    assert lease.holder("turn-1") is None


def test_fences_after_redis_lost_its_data_still_exceed_earlier_fences(
    lease: RedisTurnLease, redis_client: Redis[Any], keys: RedisKeys
) -> None:
    # Given a turn leased a few times
    for n in range(3):
        held = lease.acquire("lost-turn", f"owner-{n}", 1000)
        assert held is not None
        assert lease.release(held)
    before = held.fence
    # When Redis loses every key of the turn (a restart without persistence, a flush)
    redis_client.delete(keys.turn_fence("lost-turn"), keys.turn_lease("lost-turn"))
    # Then the next fence is still higher than any handed out before
    again = lease.acquire("lost-turn", "owner-new", 1000)
    assert again is not None and again.fence > before


def test_the_fence_counter_expires_a_day_after_the_last_acquire_and_restarts_higher(
    redis_url: str, redis_client: Redis[Any], keys: RedisKeys
) -> None:
    with RedisTurnLease(redis_url, prefix=keys.prefix) as default_lease:
        held = default_lease.acquire("turn-1", "worker-a", 1000)
        assert held is not None
        # Each acquire sets the counter to expire a day later
        assert 86_000_000 < redis_client.pttl(keys.turn_fence("turn-1")) <= 86_400_000
    with RedisTurnLease(redis_url, prefix=keys.prefix, fence_ttl_s=1) as short_lease:
        # A TTL shorter than the lease is raised to the lease's, so the counter outlives it
        again = short_lease.acquire("turn-1", "worker-a", 5000)
        assert again is not None and again.fence > held.fence
        assert 4000 < redis_client.pttl(keys.turn_fence("turn-1")) <= 5000
        assert short_lease.release(again)
        # When the counter has expired, the next fence still exceeds every earlier one
        redis_client.pexpire(keys.turn_fence("turn-1"), 1)
        time.sleep(0.05)
        assert redis_client.exists(keys.turn_fence("turn-1")) == 0
        later = short_lease.acquire("turn-1", "worker-b", 1000)
        assert later is not None and later.fence > again.fence
    with pytest.raises(ValueError):
        RedisTurnLease(redis_url, prefix=keys.prefix, fence_ttl_s=0)
