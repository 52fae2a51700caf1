"""`EventFanout`: one follower per turn tree or conversation in the server, shared by all of its event streams.

A stream that followed the feed on its own would hold a thread, a Redis connection
blocked in XREAD and its own reads of the log; 200 browsers following one conversation
would cost 200 of each. Here one thread per scope follows the feed (a `FeedFollower`:
one XREAD at a time, the log read once per save's wake-up and per poll) and keeps the
events it handed out in a ring; the streams of that scope are asyncio subscribers that
take the events from the ring, so a waiting stream costs no thread at all.

Joining: a stream first reads what it missed with reads of its own, from its client's
cursor, until it is at the end of the feed. It then joins the shared follower at that
position, which must be one the shared follower went through (its start, after one of
its events, or the end of one of its batches; the last `RING_EVENTS` events are kept).
At the end of the feed both stand at the same position (the log's last readable event,
the live channel's last entry), so a stream joins at once in the common case; a stream
that finds the shared follower elsewhere (a moment ahead of it or behind) reads again
and tries once more. From its joining position on, the shared follower's events, with
their cursors, are exactly what the stream would have followed on its own, so cursors
handed to clients mean what they always do. A stream that falls more than the ring
behind (a slow client) leaves and catches up with reads again.

A scope's follower starts with the first stream that joins it, at that stream's
position, and stops `LINGER_S` after its last stream left (a client reconnecting soon
finds it still there). If its reads fail, it stops, and its streams read on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from agent_runner import AgentEvent, EventFeed, EventScope
from agent_runner.feed import FeedFollower, FeedPosition

logger = logging.getLogger("workers.api")

T = TypeVar("T")

RING_EVENTS = 2048
"""Events each shared follower keeps for streams that have not taken them yet."""
LINGER_S = 5.0
"""How long a shared follower keeps following after its last stream left."""
_BATCH_WAIT_S = 1.0
"""Longest wait of a shared follower before it looks whether it still has streams."""


class DetachedError(Exception):
    """The subscription lost its place: its stream fell behind the ring, or the shared follower stopped."""


class EventFanout:
    """The shared followers of one server process, at most one per scope.

    Args:
        feed: The feed the followers follow.
        max_scopes: Most scopes followed at once (each takes a thread); a stream of
            another scope beyond that is told no (`subscribe` returns None and `has_room`
            is False), and follows on its own.
        poll_interval: Longest time between two reads of the log by a follower.
        ring: Events each follower keeps for its streams.
        linger: Seconds a follower goes on after its last stream left.
    """

    def __init__(
        self,
        feed: EventFeed,
        *,
        max_scopes: int = 256,
        poll_interval: float = 0.25,
        ring: int = RING_EVENTS,
        linger: float = LINGER_S,
    ) -> None:
        if max_scopes < 1 or ring < 1:
            raise ValueError(f"max_scopes and ring must be at least 1, got {max_scopes!r} and {ring!r}")
        self.feed = feed
        self.max_scopes = max_scopes
        self.poll_interval = poll_interval
        self.ring = ring
        self.linger = linger
        self._lock = threading.Lock()
        self._followers: dict[EventScope, _SharedFollower] = {}
        self._closed = False
        self.streams_closing = False
        """Set once the server stops: the streams end instead of waiting for more events."""
        self._closing = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def subscribe(self, scope: EventScope, position: FeedPosition) -> Subscription | None:
        """Join the scope's shared follower at `position`, starting one there if the scope has none.

        Must be called on the event loop the subscription is used on. Returns None when
        the scope's follower never stood at `position` (or no longer remembers it), or
        when no follower can be started (see `has_room`).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                return None
            follower = self._followers.get(scope)
            if follower is None:
                if len(self._followers) >= self.max_scopes:
                    return None
                follower = _SharedFollower(self, scope, position)
                self._followers[scope] = follower
                subscription = follower.join(position, loop)
                follower.start()
                return subscription
            return follower.join(position, loop)

    def has_room(self, scope: EventScope) -> bool:
        """Whether the scope has a shared follower, or one could be started for it."""
        with self._lock:
            return not self._closed and (scope in self._followers or len(self._followers) < self.max_scopes)

    def scopes(self) -> list[EventScope]:
        """The scopes followed now."""
        with self._lock:
            return list(self._followers)

    def close_streams(self) -> None:
        """Tell the open event streams to end now (the server is stopping); callable from any thread or a signal handler.

        Without it a server that stops waits for its streams, which never end by themselves,
        until its graceful timeout, and then cancels each with a traceback.
        """
        self.streams_closing = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._closing.set)

    async def unless_closing(self, waiting: Coroutine[Any, Any, T]) -> T | None:
        """The result of `waiting`, or None (and `waiting` cancelled) once the streams are told to close."""
        self._loop = asyncio.get_running_loop()  # before the flag is read: `close_streams` then wakes this wait
        if self.streams_closing:
            waiting.close()
            return None
        task = asyncio.ensure_future(waiting)
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((task, closing), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The client went away (this wait is cancelled): the read must not outlive its
            # stream, which the caller now leaves under it.
            task.cancel()
            raise
        finally:
            closing.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Stop every follower (their streams are detached) and wait for their threads."""
        with self._lock:
            self._closed = True
            followers = list(self._followers.values())
        for follower in followers:
            follower.stop()
        deadline = time.monotonic() + timeout
        for follower in followers:
            follower.thread.join(max(0.0, deadline - time.monotonic()))

    def _forget(self, follower: _SharedFollower, *, ended: bool = False) -> bool:
        """Remove a follower that has no subscriber (or `ended`); False if one joined meanwhile (it goes on)."""
        with self._lock, follower.lock:
            if follower.subscribers and not (follower.stopping or ended):
                return False
            follower.closed = True
            if self._followers.get(follower.scope) is follower:
                del self._followers[follower.scope]
            return True


class _SharedFollower:
    """One scope followed on a thread of its own, its recent events kept for its subscribers."""

    def __init__(self, fanout: EventFanout, scope: EventScope, start: FeedPosition) -> None:
        self.fanout = fanout
        self.scope = scope
        self.start_position = start
        self.lock = threading.Lock()
        self.events: deque[AgentEvent] = deque()
        self.first_index = 0
        """Index (in everything this follower handed out) of `events[0]`."""
        self.positions: dict[str, int] = {str(start): -1}
        """Positions this follower stood at -> index of the last event before them (-1: none)."""
        self._position_order: deque[tuple[int, str]] = deque([(-1, str(start))])
        self.subscribers: set[Subscription] = set()
        self.closed = False
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"agent-runner-events-{scope.kind}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.lock:
            self.stopping = True

    def join(self, position: FeedPosition, loop: asyncio.AbstractEventLoop) -> Subscription | None:
        with self.lock:
            if self.closed or self.stopping:
                return None
            index = self.positions.get(str(position))
            if index is None:
                return None
            subscription = Subscription(self, index, position, loop)
            self.subscribers.add(subscription)
            return subscription

    def leave(self, subscription: Subscription) -> None:
        with self.lock:
            self.subscribers.discard(subscription)

    def after(self, index: int) -> list[AgentEvent]:
        """The kept events after `index` (call with the lock held).

        Raises:
            DetachedError: Events after `index` are no longer kept, or the follower stopped.
        """
        if index + 1 < self.first_index or (self.closed and index + 1 >= self.first_index + len(self.events)):
            raise DetachedError()
        start = index + 1 - self.first_index
        return [self.events[i] for i in range(start, len(self.events))]

    def _run(self) -> None:
        idle_since: float | None = None
        try:
            follower = FeedFollower(
                self.fanout.feed, self.scope, after=self.start_position, poll_interval=self.fanout.poll_interval
            )
            while True:
                events = follower.next_batch(_BATCH_WAIT_S)
                with self.lock:
                    self._keep(events, follower.position)
                    waiting = list(self.subscribers)
                    stopping = self.stopping
                if events:
                    _wake(waiting)
                if waiting and not stopping:
                    idle_since = None
                    continue
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if (stopping or now - idle_since >= self.fanout.linger) and self.fanout._forget(self):
                    break
        except Exception as exc:
            # Its streams catch up with reads of their own, which fail on their own if the store is down.
            logger.warning("following the events of %s for its streams failed: %s", self.scope, exc)
        finally:
            self.fanout._forget(self, ended=True)
            with self.lock:
                waiting = list(self.subscribers)
            _wake(waiting)

    def _keep(self, events: list[AgentEvent], end: FeedPosition) -> None:
        """Add a batch to the ring, with the positions it went through (call with the lock held)."""
        last = self.first_index + len(self.events) - 1
        for event in events:
            self.events.append(event)
            last += 1
            self._remember(event.cursor or "", last)
        self._remember(str(end), last)
        excess = len(self.events) - self.fanout.ring
        if excess > 0:
            for _ in range(excess):
                self.events.popleft()
            self.first_index += excess
            while self._position_order and self._position_order[0][0] < self.first_index - 1:
                _, position = self._position_order.popleft()
                if self.positions.get(position, -2) < self.first_index - 1:
                    del self.positions[position]

    def _remember(self, position: str, index: int) -> None:
        if position not in self.positions:
            self.positions[position] = index
            self._position_order.append((index, position))


class Subscription:
    """A stream's place in a shared follower: the events after it, as they come."""

    def __init__(
        self, follower: _SharedFollower, index: int, position: FeedPosition, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._follower = follower
        self._index = index
        self._loop = loop
        self._changed = asyncio.Event()
        self.position = position
        """After the last event taken (where the stream stands in the feed)."""

    async def next_batch(self, timeout: float) -> list[AgentEvent]:
        """The events after the last ones taken, waiting up to `timeout` seconds; empty when none came.

        Raises:
            DetachedError: The events after this subscription's place are gone (it fell more than
                the ring behind) or the follower stopped; `position` is where it stands.
        """
        deadline = self._loop.time() + timeout
        while True:
            follower = self._follower
            with follower.lock:
                try:
                    events = follower.after(self._index)
                except DetachedError:
                    follower.subscribers.discard(self)
                    raise
                # Cleared under the lock: a batch kept after this check sets it again.
                self._changed.clear()
            if events:
                self._index += len(events)
                self.position = FeedPosition.parse(events[-1].cursor)
                return events
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return []
            # A timer rather than `wait_for`, which would start a task per wait of every stream.
            timer = self._loop.call_later(remaining, self._changed.set)
            try:
                await self._changed.wait()
            finally:
                timer.cancel()

    def close(self) -> None:
        """Leave the follower."""
        self._follower.leave(self)

    def _wake(self) -> None:
        self._changed.set()


def _wake(subscriptions: Iterable[Subscription]) -> None:
    """Wake the subscriptions on their event loops (from the follower's thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Subscription]] = {}
    for subscription in subscriptions:
        by_loop.setdefault(subscription._loop, []).append(subscription)
    for loop, group in by_loop.items():
        try:
            loop.call_soon_threadsafe(_wake_all, group)
        except RuntimeError:
            pass  # the loop is closed: its streams are gone


def _wake_all(subscriptions: list[Subscription]) -> None:
    for subscription in subscriptions:
        subscription._wake()
