"""`RedisLiveEvents`: the live event channel in Redis Streams, shared by every process of a deployment."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from agent_runner.errors import InvalidCursorError, StoreError, StoreUnavailableError
from agent_runner.events import AgentEvent
from agent_runner.persistence import DEFAULT_EVENT_PAGE, EventScope
from agent_runner.store_rules import live_scopes
from store._closing import ClosesOnExit
from store._scripts import _RETRY, _SOCKET_TIMEOUT_S, _UNAVAILABLE, RedisScripts
from store.batching import BatchingThread
from store.keys import DEFAULT_PREFIX, RedisKeys
from store.redaction import check_password_encoding, redact_url

logger = logging.getLogger(__name__)

_FIELD = "event"
"""The stream entry field that holds the event's JSON."""
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_BLOCK_SLICE_S = 1.0
"""Longest single XREAD BLOCK, well inside the socket timeout, so a dead server is noticed."""
_SCRIPT_EVENTS = 500
"""Most events appended by one script call: Redis runs a script alone, so a huge batch is cut in pieces."""


class RedisLiveEvents(ClosesOnExit):
    """A `LiveEventChannel` in Redis Streams: one stream per turn tree and one per conversation.

    `publish` appends the event (as JSON) to the stream of its root turn and, when it has
    one, of its conversation (runners give child events their root's conversation). Each
    append trims the stream to about `maxlen` entries (`MAXLEN ~`, cheap for Redis) and
    sets the stream to expire `retention_s` after this last publish, so an event is kept
    at least that long unless the length bound pushes it out, and the streams of finished
    turns vanish on their own. A cursor is the entry's stream id (`<ms>-<seq>`); the ids
    of the tree stream and of the conversation stream differ, so use a cursor only with
    the scope it was read from. `wait` is `XREAD BLOCK`.

    Args:
        redis_url: URL of the Redis server, such as `redis://127.0.0.1:6379/0`.
        prefix: Namespace of the keys (see `store.keys`).
        retention_s: Seconds an event is kept at least after the last publish to its stream.
        maxlen: About how many events each stream keeps (Redis trims in whole nodes, so
            slightly more may stay).
        client: A client to use instead of one built from `redis_url`; left open by `close()`.

    Raises:
        ValueError: Neither `redis_url` nor `client` was given, or a bound is not positive.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        retention_s: float = 300.0,
        maxlen: int = 10_000,
        client: Redis[Any] | None = None,
    ) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be positive, got {retention_s!r}")
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen!r}")
        self._keys = RedisKeys(prefix)
        self.retention_s = retention_s
        self.maxlen = maxlen
        self._retention_ms = math.ceil(retention_s * 1000)
        if client is not None:
            self._client = client
            self._owns_client = False
            self._server = "the given client's server"
        elif redis_url is not None:
            check_password_encoding(redis_url)
            self._client = Redis.from_url(
                redis_url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S, retry=_RETRY
            )
            self._owns_client = True
            self._server = redact_url(redis_url)
        else:
            raise ValueError("RedisLiveEvents needs a redis_url or a client, got neither")
        self._scripts = RedisScripts(redis_url, self._client, ["live_publish"])

    def publish(self, event: AgentEvent) -> None:
        """Append the event to its tree's and conversation's streams; never raises (failures are logged)."""
        self.publish_many([event])

    def publish_many(self, events: Sequence[AgentEvent]) -> None:
        """Append the events, in order, to their streams in one round trip; never raises (failures are logged).

        The round trip is one call of `store/lua/live_publish.lua` (one per 500 events): the
        appends, then each stream's retention restarted once.
        """
        for start in range(0, len(events), _SCRIPT_EVENTS):
            self._append(events[start : start + _SCRIPT_EVENTS])

    def _append(self, events: Sequence[AgentEvent]) -> None:
        try:
            streams: dict[str, int] = {}  # key -> its position in the script's KEYS
            args: list[str | int] = [self.maxlen, self._retention_ms]
            for event in events:
                payload = event.model_dump_json(exclude={"cursor"})
                for scope in live_scopes(event):
                    args += (streams.setdefault(self._keys.events(scope), len(streams) + 1), payload)
            _, failed, reason = self._scripts.run("live_publish", list(streams), args)
        except Exception as exc:
            failed, reason = len(events), f"{type(exc).__name__}: {exc}"
        if not failed:
            return
        first = events[0]
        if len(events) == 1:
            logger.warning(
                "publishing live event %s of turn %s to Redis at %s failed; it is lost: %s",
                first.type,
                first.turn_id,
                self._server,
                reason,
            )
        else:
            logger.warning(
                "publishing %d live events (the first %s of turn %s) to Redis at %s failed; %d of them are lost: %s",
                len(events),
                first.type,
                first.turn_id,
                self._server,
                failed,
                reason,
            )

    def read(self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE) -> list[AgentEvent]:
        """Return up to `limit` kept events of the scope after the stream id `after`, oldest first.

        Raises:
            InvalidCursorError: `after` is not a stream id.
            StoreUnavailableError: Redis could not be reached in time.
        """
        key = self._keys.events(scope)
        start = _stream_id(after)
        if limit <= 0:
            return []
        return self._xread(key, start, limit, None)

    def wait(self, scope: EventScope, *, after: str | None = None, timeout: float) -> list[AgentEvent]:
        """Return the kept events after `after`, blocking up to `timeout` seconds for one (XREAD BLOCK).

        Raises:
            InvalidCursorError: `after` is not a stream id.
            StoreUnavailableError: Redis could not be reached in time.
        """
        key = self._keys.events(scope)
        start = _stream_id(after)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._xread(key, start, DEFAULT_EVENT_PAGE, None)
            # BLOCK 0 would wait forever: block at least one millisecond.
            block_ms = max(1, int(min(remaining, _BLOCK_SLICE_S) * 1000))
            found = self._xread(key, start, DEFAULT_EVENT_PAGE, block_ms)
            if found:
                return found

    def close(self) -> None:
        """Close the Redis client built from `redis_url` (a client passed in stays open)."""
        if self._owns_client:
            self._client.close()

    def _xread(self, key: str, start: str, count: int, block_ms: int | None) -> list[AgentEvent]:
        try:
            reply = self._client.xread({key: start}, count=count, block=block_ms)
        except RedisError as exc:
            kind = StoreUnavailableError if isinstance(exc, _UNAVAILABLE) else StoreError
            raise kind(f"reading live events from Redis at {self._server} failed: {type(exc).__name__}") from exc
        events: list[AgentEvent] = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                cursor = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                raw = fields.get(_FIELD.encode(), fields.get(_FIELD))
                try:
                    if raw is None:
                        raise ValueError("no event field")
                    event = AgentEvent.model_validate_json(raw)
                except ValueError:
                    logger.warning("skipping entry %s of %s: not an agent event", cursor, key)
                    continue
                events.append(event.model_copy(update={"cursor": cursor}))
        return events


class BackgroundPublisher(BatchingThread[AgentEvent]):
    """Publishes events to a `RedisLiveEvents` from a thread of its own, so that a step never waits for Redis.

    Called with an event (it is an event listener), it only queues it. The thread sends
    everything queued by then in one script call, in the order queued, so under load many
    events share one round trip; and it starts a batch at most every `pause_s` (5 ms), so
    that a worker streaming many answers sends its deltas in a few large batches rather
    than in many small ones, each of which costs the worker a round trip and a wake-up. An
    event that comes after a quiet spell still goes out at once; under load an event waits
    at most `pause_s` more. The live channel is best-effort either way (a failed publish
    is logged and the event lost; durable events are read from the store), and followers
    read durable events from the store, only waking up on their live copy. At most
    `max_pending` events wait; beyond that new ones are dropped with a warning. The thread
    starts with the first event (so a process that forks after building this starts its
    own) and ends on `close`, which first sends what is queued.

    Args:
        live: The channel to publish to.
        max_pending: Most events waiting to be sent.
        pause_s: Least time from the start of one batch to the start of the next.
    """

    def __init__(self, live: RedisLiveEvents, *, max_pending: int = 10_000, pause_s: float = 0.005) -> None:
        super().__init__("live-event-publisher", max_pending=max_pending, pause_s=pause_s)
        self.live = live
        self._dropped = 0

    def __call__(self, event: AgentEvent) -> None:
        """Queue the event for the thread; never blocks on Redis and never raises."""
        if self._offer(event):
            return
        with self._ready:
            if self._closed:
                return
            self._dropped += 1
            dropped = self._dropped
        if dropped in (1, 100) or dropped % 10_000 == 0:
            logger.warning("live events pile up faster than Redis takes them; %d dropped", dropped)

    def _send_batch(self, batch: list[AgentEvent]) -> None:
        self.live.publish_many(batch)


def _stream_id(cursor: str | None) -> str:
    if cursor is None:
        return "0-0"
    if not _STREAM_ID.fullmatch(cursor):
        raise InvalidCursorError(cursor, "expected a Redis stream id such as '1700000000000-0'")
    return cursor
