"""`EventFeed`: the events of a turn tree or a conversation, durable and live, behind one cursor.

Durable events (every type but MODEL_DELTA and TOOL_PROGRESS) come from the turn store's
`EventLog`, where they were written with the save that caused them; ephemeral ones come
from a `LiveEventChannel`. A runner also publishes its durable events to the live channel
after the save, only to wake up waiting subscribers: the feed takes durable types from the
log alone, so no event appears twice.

Ordering: the durable events of one turn come in the order their saves committed, and
those of parallel turns of a tree in an order consistent with their commits. Ephemeral
events come in the order the live channel received them and are interleaved with the
durable ones by timestamp, as far as each page allows; a durable event becomes visible
only once it is committed, so it may follow ephemeral events that happened after it.

Cursors: each returned event's `cursor` is `"<log cursor>:<live cursor>"` (either part may
be empty), opaque to clients and made of URL-safe characters. Reading after it returns
exactly what followed that event in both sources. Ephemeral events older than the live
channel's retention are gone; durable ones stay until pruned.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass

from agent_runner.errors import InvalidCursor, StoreError
from agent_runner.events import AgentEvent
from agent_runner.persistence import DEFAULT_EVENT_PAGE, EventLog, LiveEventChannel, event_scope

logger = logging.getLogger(__name__)

_CURSOR = re.compile(r"[A-Za-z0-9._-]*:[A-Za-z0-9._-]*")
_MAX_CURSOR_LENGTH = 256
_MAX_LIVE_PAGES = 50
"""Pages of live events one read goes through to find ephemeral ones behind durable wake-ups."""
_REMEMBERED_IDS = 10_000
"""Event ids `follow` remembers to drop an event the live channel delivered twice."""


@dataclass(frozen=True)
class FeedPosition:
    """A position in both sources of a feed: the log's cursor and the live channel's (None: the start)."""

    log: str | None = None
    live: str | None = None

    def __str__(self) -> str:
        return f"{self.log or ''}:{self.live or ''}"

    @classmethod
    def parse(cls, cursor: str | None) -> FeedPosition:
        """Return the position a feed cursor stands for; None is the start of both sources.

        Raises:
            InvalidCursor: The text is not a feed cursor.
        """
        if cursor is None:
            return cls()
        if len(cursor) > _MAX_CURSOR_LENGTH or not _CURSOR.fullmatch(cursor):
            raise InvalidCursor(cursor, "expected '<log cursor>:<live cursor>' of URL-safe characters")
        log, _, live = cursor.partition(":")
        return cls(log or None, live or None)


@dataclass(frozen=True)
class _Page:
    events: list[AgentEvent]
    end: FeedPosition
    """Where the next page starts: after everything this page went through, emitted or not."""


class EventFeed:
    """The events of a turn tree or a conversation from the durable log and the live channel, in one stream.

    Args:
        log: Where durable events are read (the turn store).
        live: Where ephemeral events are read and waited for; None for durable events only
            (then `follow` polls the log).
    """

    def __init__(self, log: EventLog, live: LiveEventChannel | None = None) -> None:
        self.log = log
        self.live = live

    def read(
        self,
        *,
        root_turn_id: str | None = None,
        conversation_id: str | None = None,
        after: str | None = None,
        limit: int = DEFAULT_EVENT_PAGE,
    ) -> list[AgentEvent]:
        """Return up to `limit` events after the cursor `after` (None: from the start), each with its `cursor`.

        Exactly one of `root_turn_id` and `conversation_id` must be given.

        Raises:
            InvalidEventQuery: Neither or both of `root_turn_id` and `conversation_id` were given.
            InvalidCursor: `after` is not a cursor of this feed.
            StoreError: The durable log could not be read. (A failing live channel is
                logged and its events are left for a later read.)
        """
        event_scope(root_turn_id, conversation_id)
        if limit <= 0:
            return []
        page = self._page(root_turn_id, conversation_id, FeedPosition.parse(after), limit)
        return page.events

    def follow(
        self,
        *,
        root_turn_id: str | None = None,
        conversation_id: str | None = None,
        after: str | None = None,
        timeout: float,
        poll_interval: float = 0.25,
    ) -> Generator[AgentEvent, None, None]:
        """Yield events after the cursor `after` as they come, until `timeout` seconds pass with none.

        With a live channel it waits on the channel, waking for ephemeral events and for the
        wake-ups runners publish after each save; it still reads the log at least every
        `poll_interval` seconds, since a committed event becomes readable only once the
        transactions that started before it have ended. Without one it polls the log.

        Raises:
            InvalidEventQuery: Neither or both of `root_turn_id` and `conversation_id` were given.
            InvalidCursor: `after` is not a cursor of this feed.
            StoreError: The durable log could not be read.
        """
        event_scope(root_turn_id, conversation_id)
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        position = FeedPosition.parse(after)
        recent: OrderedDict[str, None] = OrderedDict()
        idle_until = time.monotonic() + timeout
        while True:
            page = self._page(root_turn_id, conversation_id, position, DEFAULT_EVENT_PAGE)
            position = page.end
            for event in page.events:
                if event.event_id in recent:
                    continue
                recent[event.event_id] = None
                if len(recent) > _REMEMBERED_IDS:
                    recent.popitem(last=False)
                idle_until = time.monotonic() + timeout
                yield event
            if page.events:
                continue
            remaining = idle_until - time.monotonic()
            if remaining <= 0:
                return
            self._pause(root_turn_id, conversation_id, position, min(poll_interval, remaining))

    def _pause(self, root_turn_id: str | None, conversation_id: str | None, at: FeedPosition, seconds: float) -> None:
        """Sleep until the live channel has something after `at`, or `seconds` pass."""
        if self.live is not None:
            started = time.monotonic()
            try:
                self.live.wait(
                    root_turn_id=root_turn_id, conversation_id=conversation_id, after=at.live, timeout=seconds
                )
                return
            except StoreError as exc:
                logger.warning("waiting on the live event channel failed, polling instead: %s", exc)
            seconds -= time.monotonic() - started
        if seconds > 0:
            time.sleep(seconds)

    def _page(self, root_turn_id: str | None, conversation_id: str | None, start: FeedPosition, limit: int) -> _Page:
        """Merge the next events of both sources after `start`.

        The two sources are merged by timestamp, each keeping its own order, so every
        prefix of the result corresponds to a position in both. A source that returned a
        full page may have more to come, so the merge stops where that page ends: its next
        events could be older than what the other source holds.
        """
        durable = self.log.read_events(
            root_turn_id=root_turn_id, conversation_id=conversation_id, after=start.log, limit=limit
        )
        durable_full = len(durable) >= limit
        live, live_full = self._live_page(root_turn_id, conversation_id, start.live, limit)
        log_at, live_at = start.log, start.live
        out: list[AgentEvent] = []
        emitted: set[str] = set()
        i = j = 0
        while len(out) < limit:
            durable_left, live_left = i < len(durable), j < len(live)
            if (not durable_left and durable_full) or (not live_left and live_full):
                break
            if not durable_left and not live_left:
                break
            if durable_left and (not live_left or durable[i].timestamp < live[j].timestamp):
                event = durable[i]
                i += 1
                log_at = event.cursor
                emit = True
            else:
                event = live[j]
                j += 1
                live_at = event.cursor
                # Durable types on the live channel only announce a save; the log has them.
                emit = not event.type.is_durable and event.event_id not in emitted
            if emit:
                emitted.add(event.event_id)
                out.append(event.model_copy(update={"cursor": str(FeedPosition(log_at, live_at))}))
        return _Page(out, FeedPosition(log_at, live_at))

    def _live_page(
        self, root_turn_id: str | None, conversation_id: str | None, after: str | None, limit: int
    ) -> tuple[list[AgentEvent], bool]:
        """Return the live events after `after` up to `limit` ephemeral ones, and whether more may follow.

        Durable wake-ups are returned too (the merge skips them but moves past them); pages
        are read until `limit` ephemeral events are found or the channel has no more, so a
        long run of wake-ups cannot hide the ephemeral events behind it.
        """
        if self.live is None:
            return [], False
        found: list[AgentEvent] = []
        ephemeral = 0
        cursor = after
        try:
            for _ in range(_MAX_LIVE_PAGES):
                page = self.live.read(
                    root_turn_id=root_turn_id, conversation_id=conversation_id, after=cursor, limit=limit
                )
                found.extend(page)
                ephemeral += sum(1 for event in page if not event.type.is_durable)
                if len(page) < limit:
                    return found, False
                if ephemeral >= limit:
                    return found, True
                cursor = page[-1].cursor
        except StoreError as exc:
            # Ephemeral events are best effort: serve the durable ones and try the channel again next time.
            logger.warning("reading the live event channel failed; serving durable events only: %s", exc)
            return [], False
        return found, True
