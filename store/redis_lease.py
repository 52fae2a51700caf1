"""The turn lease in Redis: per-turn mutual exclusion for workers on many machines."""

from __future__ import annotations

from typing import Any

from redis import Redis

from agent_runner.persistence import Lease
from store._closing import ClosesOnExit
from store._scripts import RedisScripts
from store.keys import DEFAULT_PREFIX, RedisKeys

_SCRIPTS = ("lease_acquire", "lease_renew", "lease_release", "lease_holder")

DEFAULT_FENCE_TTL_S = 24 * 3600
"""How long a turn's fence counter outlives its last acquire (see `lease_acquire.lua` for why expiry is safe)."""


def _check_ttl(ttl_ms: int) -> None:
    # PEXPIRE with zero or a negative TTL deletes the key: the caller would be told it
    # holds a lease that no longer exists.
    if ttl_ms < 1:
        raise ValueError(f"a lease TTL must be a positive number of milliseconds, got {ttl_ms!r}")


class RedisTurnLease(ClosesOnExit):
    """A `TurnLease` kept in Redis, shared by every worker that reaches the same server.

    A lease is a hash `{owner, fence}` that Redis expires after the TTL, so a worker that
    dies frees its turn without help. Each acquisition takes the next number from a
    per-turn counter that outlives the lease by far (`fence_ttl_s` after the last
    acquire); saves carry it, so a worker that paused past its TTL while another took the
    turn over is refused by the store even if it wakes up believing it still holds the
    lease. A counter that expired (or was lost) restarts from the Redis clock in
    microseconds, above every fence handed out before. Renew and release check owner and
    fence together.

    Expiry runs on the Redis server's clock. A holder should count its TTL from the moment
    it sent `acquire` or `renew`, not from the reply, and renew well before it runs out.

    Every operation is one Lua script, so the check and the write cannot interleave with
    another worker's. One instance may be shared by threads. Use it as a context manager,
    or call `close()`, to close the client built from `redis_url`.

    Args:
        redis_url: URL of the Redis server, such as `redis://127.0.0.1:6379/0`.
        prefix: Namespace of the keys (see `store.keys`).
        client: A client to use instead of one built from `redis_url`; left open by `close()`.
        fence_ttl_s: Seconds a turn's fence counter is kept after its last acquire.

    Raises:
        ValueError: `fence_ttl_s` is below one second.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        client: Redis[Any] | None = None,
        fence_ttl_s: int = DEFAULT_FENCE_TTL_S,
    ) -> None:
        if fence_ttl_s < 1:
            raise ValueError(f"fence_ttl_s must be at least 1 second, got {fence_ttl_s!r}")
        self._keys = RedisKeys(prefix)
        self._fence_ttl_ms = fence_ttl_s * 1000
        self._scripts = RedisScripts(redis_url, client, _SCRIPTS)

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        """Take the lease if it is free or expired; None when another owner holds it.

        An owner that already holds the lease gets it again with a new fence, which retires
        its earlier `Lease`.

        Raises:
            ValueError: `ttl_ms` is not positive.
            StoreUnavailableError: Redis could not be reached in time.
        """
        _check_ttl(ttl_ms)
        fence = self._scripts.run(
            "lease_acquire",
            [self._keys.turn_lease(turn_id), self._keys.turn_fence(turn_id)],
            [owner, ttl_ms, max(self._fence_ttl_ms, ttl_ms)],
        )
        return None if fence is None else Lease(turn_id, owner, int(fence))

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        """Extend the lease to `ttl_ms` from now; False when it expired or another owner or fence holds it.

        Raises:
            ValueError: `ttl_ms` is not positive.
            StoreUnavailableError: Redis could not be reached in time.
        """
        _check_ttl(ttl_ms)
        renewed = self._scripts.run(
            "lease_renew", [self._keys.turn_lease(lease.turn_id)], [lease.owner, lease.fence, ttl_ms]
        )
        return bool(renewed == 1)

    def release(self, lease: Lease) -> bool:
        """Give the lease up; False when it had expired or another owner or fence holds it.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        released = self._scripts.run(
            "lease_release", [self._keys.turn_lease(lease.turn_id)], [lease.owner, lease.fence]
        )
        return bool(released == 1)

    def holder(self, turn_id: str) -> Lease | None:
        """Return the unexpired lease of the turn, or None when it is free.

        Meant for diagnostics and tests: by the time the caller looks at it, the lease may
        have expired or changed hands.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        held = self._scripts.run("lease_holder", [self._keys.turn_lease(turn_id)], [])
        if held is None:
            return None
        owner, fence = held
        return Lease(turn_id, str(owner), int(fence))

    def close(self) -> None:
        """Close the Redis client built from `redis_url` (a client passed in stays open)."""
        self._scripts.close()
