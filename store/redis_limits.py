"""Shared model limits in Redis: one budget of requests, tokens and concurrent calls for a whole fleet."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Unpack

from redis import Redis

from agent_runner.model_limits import (
    PERIOD_MS,
    Decision,
    KeyedModelLimiter,
    LimitedCall,
    LimiterOptions,
    LimitGrant,
    LimitReason,
    ModelLimit,
)
from store._closing import ClosesOnExit
from store._scripts import RedisScripts
from store.keys import DEFAULT_PREFIX, RedisKeys

_SCRIPTS = ("model_limit_acquire", "model_limit_settle", "model_limit_pause")


class RedisModelLimiter(KeyedModelLimiter, ClosesOnExit):
    """A `ModelLimiter` kept in Redis, shared by every process that reaches the same server.

    Each decision is one Lua script (`store/lua/model_limit_*.lua`), which mirrors the
    in-process algorithm of `agent_runner.model_limits`; the Redis clock is the one clock of
    the fleet. Keys not named in `limits` are not limited and cost no round trip.

    Args:
        limits: The limits by key (every process should be given the same ones).
        redis_url: URL of the Redis server, such as `redis://127.0.0.1:6379/0`.
        prefix: Namespace of the keys (see `store.keys`).
        client: A client to use instead of one built from `redis_url`; left open by `close()`.
        clock: Seconds since the epoch to decide with, instead of the Redis clock (for tests
            that walk time; every process of a fleet must then share it).
        **options: The options of every limiter (`LimiterOptions`).
    """

    def __init__(
        self,
        limits: Mapping[str, ModelLimit],
        redis_url: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        client: Redis[Any] | None = None,
        clock: Callable[[], float] | None = None,
        **options: Unpack[LimiterOptions],
    ) -> None:
        super().__init__(limits, **options)
        self._keys = RedisKeys(prefix)
        self._scripts = RedisScripts(redis_url, client, _SCRIPTS)
        self._clock = clock
        self._encodings: dict[str, tuple[tuple[str, str, str, str, str], str]] = {}

    def _decide(self, limit: ModelLimit, call: LimitedCall) -> Decision:
        keys, spec = self._encoded(call.key, limit)
        now = "" if self._clock is None else _ms(self._clock() * 1000)
        args: list[str | int] = [
            call.reservation_id,
            call.tokens,
            spec,
            call.booking_id or "",
            now,
            call.lane,
            call.weight,
        ]
        reply = self._scripts.run("model_limit_acquire", keys, args)
        granted, until, reason, booking, server_now = reply
        # The wait is measured on the server's clock and carried over to this process's, so
        # a difference between the two clocks neither shortens nor lengthens it.
        local_now = self._clock() * 1000 if self._clock is not None else time.time() * 1000
        return Decision(
            granted=int(granted) == 1,
            until_ms=local_now + float(until) - float(server_now),
            reason=LimitReason(reason) if reason else None,
            booking_id=booking or None,
        )

    def _encoded(self, key: str, limit: ModelLimit) -> tuple[tuple[str, str, str, str, str], str]:
        # Encoded once per key: the acquire script is on every model call's path.
        found = self._encodings.get(key)
        if found is None:
            numbers = (limit.rpm or 0, limit.tpm or 0, limit.concurrency or 0, limit.burst)
            timing = (self._lease_ms, self._grace_ms, self._poll_ms)
            spec = " ".join([*(str(n) for n in numbers), *(_ms(ms) for ms in timing)])
            found = self._encodings[key] = (self._keys.model_limit(key), spec)
        return found

    def settle(self, grant: LimitGrant, actual_tokens: int | None) -> None:
        """Count the call's actual tokens and free its slot.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        limit = self.limits.get(grant.key)
        if limit is None or (limit.tpm is None and limit.concurrency is None):
            return  # nothing to count or free: no round trip
        (state, calls, *_), _ = self._encoded(grant.key, limit)
        delta = "" if actual_tokens is None else actual_tokens - grant.tokens
        self._scripts.run("model_limit_settle", [state, calls], [grant.reservation_id, delta, limit.tpm or 0])

    def pause(self, key: str, until: datetime) -> None:
        """No call against `key` may go before `until`, in any process.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        limit = self.limits.get(key)
        if limit is None:
            return
        keep_ms = PERIOD_MS + self._lease_ms + self._grace_ms
        now = self._clock() if self._clock is not None else time.time()
        (state, *_), _ = self._encoded(key, limit)
        pause_ms = _ms(max(0.0, until.timestamp() - now) * 1000)
        server_now = "" if self._clock is None else _ms(now * 1000)
        self._scripts.run(
            "model_limit_pause", [state], [pause_ms, limit.rpm or 0, limit.burst, _ms(keep_ms), server_now]
        )

    def close(self) -> None:
        """Close the client built from `redis_url`."""
        self._scripts.close()


def _ms(value: float) -> str:
    return f"{value:.3f}"
