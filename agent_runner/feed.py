"""`EventFeed`: the events of a turn tree or a conversation, durable and live, behind one cursor.

Durable events (every type but MODEL_DELTA and TOOL_PROGRESS) come from the turn store's
`EventLog`, where they were written with the save that caused them; ephemeral ones come
from a `LiveEventChannel`. A runner also publishes its durable events to the live channel
after the save, only to wake up waiting subscribers: the feed takes durable types from the
log alone, so no event appears twice.

Ordering: the durable events of a turn tree or a conversation come in the order their
saves committed. Ephemeral events come in the order the live channel received them and
are interleaved with the durable ones by timestamp, as far as each page allows. A page
reads the live channel before and after the log (see `_page`), so the deltas of a model
call come before the save of its answer, and a durable event announced after its save
comes before the ephemeral events published after it. One announced before its save
(TOOL_STARTED) becomes visible only once that save commits, so it may follow ephemeral
events that happened after it.

Cursors: each returned event's `cursor` is `"<log cursor>:<live cursor>"` (either part may
be empty), opaque to clients and made of URL-safe characters. Reading after it returns
exactly what followed that event in both sources. Ephemeral events older than the live
channel's retention are gone; durable ones stay until pruned.

Following: the log is read only when something new may be there: first, after a durable
wake-up on the live channel (then again a few times shortly after, until the announced
event is readable: some are announced before their save), after a full page, and every
poll interval (a wake-up may be lost). Ephemeral events that arrive while waiting are
handed out straight from the wait, so a stream of deltas costs no log reads.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from agent_runner.errors import InvalidCursorError, StoreError
from agent_runner.events import AgentEvent
from agent_runner.persistence import DEFAULT_EVENT_PAGE, EventLog, EventScope, LiveEventChannel

logger = logging.getLogger(__name__)

_CURSOR = re.compile(r"[A-Za-z0-9._-]*:[A-Za-z0-9._-]*")
_MAX_CURSOR_LENGTH = 256
_MAX_LIVE_PAGES = 50
"""Pages of live events one read goes through to find ephemeral ones behind durable wake-ups."""
_REMEMBERED_IDS = 10_000
"""Event ids `follow` remembers to drop an event the live channel delivered twice."""
_FIRST_RETRY_S = 0.01
"""Delay of the first re-read of the log when a durable event announced on the live channel was not readable yet.

Each further re-read waits twice as long, up to the poll interval."""
_AWAITED_S = 60.0
"""How long a durable event announced on the live channel is looked out for in the log (it may never come:
its save can fail after the announcement of an event delivered early, such as TOOL_STARTED)."""
_MAX_AWAITED = 1000
"""Most announced durable events looked out for at once (the oldest are given up first)."""


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
            InvalidCursorError: The text is not a feed cursor.
        """
        if cursor is None:
            return cls()
        if len(cursor) > _MAX_CURSOR_LENGTH or not _CURSOR.fullmatch(cursor):
            raise InvalidCursorError(cursor, "expected '<log cursor>:<live cursor>' of URL-safe characters")
        log, _, live = cursor.partition(":")
        return cls(log or None, live or None)


@dataclass(frozen=True)
class FeedPage:
    """One read of a feed: its events, where the next read starts, and whether more may be there already."""

    events: list[AgentEvent]
    end: FeedPosition
    """Where the next page starts: after everything this page went through, emitted or not."""
    more: bool
    """A source returned a full page, so more events may be readable now."""


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

    def read(self, scope: EventScope, *, after: str | None = None, limit: int = DEFAULT_EVENT_PAGE) -> list[AgentEvent]:
        """Return up to `limit` events of the scope after the cursor `after` (None: from the start), each with its `cursor`.

        Raises:
            InvalidCursorError: `after` is not a cursor of this feed.
            StoreError: The durable log could not be read. (A failing live channel is
                logged and its events are left for a later read.)
        """
        if limit <= 0:
            return []
        return self.read_page(scope, after=after, limit=limit).events

    def read_page(
        self, scope: EventScope, *, after: FeedPosition | str | None = None, limit: int = DEFAULT_EVENT_PAGE
    ) -> FeedPage:
        """Like `read`, but return the page with the position after everything it went through.

        The position can be past the last event's cursor: durable wake-ups on the live
        channel are gone through but not returned.

        Raises:
            InvalidCursorError: `after` is not a cursor of this feed.
            StoreError: The durable log could not be read.
        """
        start = after if isinstance(after, FeedPosition) else FeedPosition.parse(after)
        if limit <= 0:
            return FeedPage([], start, False)
        return self._page(scope, start, limit)

    def follow(
        self, scope: EventScope, *, after: str | None = None, timeout: float, poll_interval: float = 0.25
    ) -> Generator[AgentEvent, None, None]:
        """Yield events after the cursor `after` as they come, until `timeout` seconds pass with none.

        With a live channel it waits on the channel: ephemeral events come straight from
        the wait, and the log is read after the wake-ups runners publish after each save;
        it is still read at least every `poll_interval` seconds, since a wake-up may be
        lost. Without a live channel it polls the log. See `FeedFollower`.

        Raises:
            InvalidCursorError: `after` is not a cursor of this feed.
            StoreError: The durable log could not be read.
        """
        follower = FeedFollower(self, scope, after=after, poll_interval=poll_interval)
        idle_until = time.monotonic() + timeout
        while True:
            events = follower.next_batch(max(0.0, idle_until - time.monotonic()))
            if not events:
                return
            for event in events:
                idle_until = time.monotonic() + timeout
                yield event

    def _page(self, scope: EventScope, start: FeedPosition, limit: int) -> FeedPage:
        """Merge the next events of both sources after `start`.

        The two sources are merged by timestamp, each keeping its own order, so every
        prefix of the result corresponds to a position in both. A source that returned a
        full page may have more to come, so the merge stops where that page ends: its next
        events could be older than what the other source holds.
        """
        # The live channel is read before the log and again after it. A runner announces a
        # save after its commit, and publishes the deltas of a model call before the save of
        # its answer, so:
        # - every save announced in the first live read is in the log read after it, and the
        #   ephemeral events published after that announcement may follow it;
        # - every ephemeral event published before a save the log read shows is in one of the
        #   two live reads, and comes before that save;
        # - a save announced in the second live read but missing from the log committed after
        #   the log was read: the merge stops at its announcement, so the ephemeral events
        #   published after it wait for the next page, which has the save.
        live, live_full = self._live_page(scope, start.live, limit)
        durable = self.log.read_events(scope, after=start.log, limit=limit)
        settled = len(live)
        if not live_full:
            after_first = live[-1].cursor if live else start.live
            later, live_full = self._live_page(scope, after_first, limit)
            live += later
        in_log = {event.event_id for event in durable}
        # A full log page needs no check of its own: each of its events is handed out, so
        # the page is full by its last one (and `more` then says so).
        more = live_full
        log_at, live_at = start.log, start.live
        # The live part of a durable event's cursor is the last ephemeral event served before
        # it, not the wake-ups gone through since: whether a save's wake-up was published yet
        # when a page was read must not change the event's cursor from one read to the next.
        # (A read after such a cursor goes through those wake-ups again, and skips them.)
        shown_live = start.live
        out: list[AgentEvent] = []
        emitted: set[str] = set()
        i = j = 0
        while len(out) < limit:
            durable_left, live_left = i < len(durable), j < len(live)
            if not live_left and live_full:
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
                if j >= settled and event.type.is_durable and event.event_id not in in_log:
                    more = True  # announced after the log was read: the next page has its save
                    break
                j += 1
                live_at = event.cursor
                # Durable types on the live channel only announce a save; the log has them.
                emit = not event.type.is_durable and event.event_id not in emitted
                if emit:
                    shown_live = live_at
            if emit:
                emitted.add(event.event_id)
                out.append(event.model_copy(update={"cursor": str(FeedPosition(log_at, shown_live))}))
        return FeedPage(out, FeedPosition(log_at, live_at), more or len(out) >= limit)

    def _live_page(self, scope: EventScope, after: str | None, limit: int) -> tuple[list[AgentEvent], bool]:
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
                page = self.live.read(scope, after=cursor, limit=limit)
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


class FeedReader:
    """Reads the events of a turn tree or a conversation page by page, each page moving its position on.

    The one place a feed is paged from a position: `FeedFollower` reads its pages here,
    and so does whatever catches up from a client's cursor before it follows.

    Args:
        feed: The feed to read.
        scope: The turn tree or conversation to read.
        after: Start after this feed cursor or position (None: from the start).

    Raises:
        InvalidCursorError: `after` is not a cursor of this feed.
    """

    def __init__(self, feed: EventFeed, scope: EventScope, *, after: FeedPosition | str | None = None) -> None:
        self.feed = feed
        self.scope = scope
        self.position = after if isinstance(after, FeedPosition) else FeedPosition.parse(after)
        """Where the next read starts: after every event handed out and every wake-up gone through."""
        self.read_due = True
        """Whether events may be readable at once: nothing was read yet, the last page was full, or a
        wake-up said so. A page that was not full clears it."""

    def read_page(self, limit: int = DEFAULT_EVENT_PAGE) -> FeedPage:
        """Read the next page after the position and move the position past everything it went through.

        Raises:
            StoreError: The durable log could not be read.
        """
        page = self.feed.read_page(self.scope, after=self.position, limit=limit)
        self.position = page.end
        self.read_due = page.more
        return page

    def pages(self) -> Iterator[FeedPage]:
        """Read page after page up to the end of what is readable now (a page that is not full is the last).

        Raises:
            StoreError: The durable log could not be read.
        """
        while True:
            page = self.read_page()
            yield page
            if not page.more:
                return


class FeedFollower(FeedReader):
    """Follows the events of a turn tree or a conversation from a position, one batch at a time.

    `EventFeed.follow` runs one; callers that need more than a generator (the position
    after everything handed out, batches with a deadline) use it directly. Not
    thread-safe: one thread calls `next_batch` at a time.

    What it reads, and when:

    - the log (with a page of the live channel, merged as `EventFeed.read` does) first;
      again at once after a full page; after a durable event was announced on the live
      channel (a runner's wake-up after a save); and at least every `poll_interval`
      seconds. An announced event that was not readable yet (a runner announces some
      events, such as TOOL_STARTED, before their save) is looked for again after 10, 20,
      40 ms and so on, up to the poll interval, until it comes.
    - the live channel in between: it waits there, and hands out the ephemeral events the
      wait returns directly, without a read of the log. At the first announcement of a
      durable event it has not handed out, it stops and merges the log with the live
      channel from there, so a turn's events keep the order of `read` wherever the log
      has caught up.

    Ephemeral events may thus come before a durable event that happened earlier but was
    not readable yet (as `read` may have them too). Every event comes once: an event id
    handed out is remembered (the last `_REMEMBERED_IDS`) and not handed out again.

    Args:
        feed: The feed to follow.
        scope: The turn tree or conversation to follow.
        after: Start after this feed cursor or position (None: from the start).
        poll_interval: Longest time between two reads of the log, in seconds.

    Raises:
        InvalidCursorError: `after` is not a cursor of this feed.
        ValueError: `poll_interval` is not positive.
    """

    def __init__(
        self,
        feed: EventFeed,
        scope: EventScope,
        *,
        after: FeedPosition | str | None = None,
        poll_interval: float = 0.25,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        super().__init__(feed, scope, after=after)
        self.poll_interval = poll_interval
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._awaited: OrderedDict[str, float] = OrderedDict()
        """Durable events announced on the live channel and not read from the log yet -> when announced."""
        self._next_log_read = 0.0
        self._retries = 0

    def next_batch(self, timeout: float) -> list[AgentEvent]:
        """Return the next events, waiting up to `timeout` seconds for some; empty when none came in that time.

        Raises:
            StoreError: The durable log could not be read. (A failing live channel is logged
                and the log polled instead.)
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self.read_due or time.monotonic() >= self._next_log_read:
                events = self._read_log()
                if events:
                    return events
                if self.read_due:
                    continue  # a full page of events handed out before: read on
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return []
            events = self._wait(min(remaining, max(self._next_log_read - now, 0.0)))
            if events:
                return events

    def _read_log(self) -> list[AgentEvent]:
        page = self.read_page()
        for event in page.events:
            self._awaited.pop(event.event_id, None)
        now = time.monotonic()
        while self._awaited and (
            len(self._awaited) > _MAX_AWAITED or next(iter(self._awaited.values())) < now - _AWAITED_S
        ):
            self._awaited.popitem(last=False)
        if self._awaited:
            # An announced event is not readable yet: look again soon, then less and less often.
            self._next_log_read = now + min(self.poll_interval, _FIRST_RETRY_S * 2**self._retries)
            self._retries += 1
        else:
            self._next_log_read = now + self.poll_interval
            self._retries = 0
        return self._fresh(page.events)

    def _wait(self, seconds: float) -> list[AgentEvent]:
        """Wait up to `seconds` on the live channel; return the ephemeral events it brought (see the class)."""
        live = self.feed.live
        if seconds <= 0:
            return []
        if live is None:
            time.sleep(seconds)
            return []
        started = time.monotonic()
        try:
            found = live.wait(self.scope, after=self.position.live, timeout=seconds)
        except StoreError as exc:
            logger.warning("waiting on the live event channel failed, polling instead: %s", exc)
            left = seconds - (time.monotonic() - started)
            if left > 0:
                time.sleep(left)
            return []
        out: list[AgentEvent] = []
        for event in found:
            if event.type.is_durable:
                if event.event_id not in self._recent:
                    # A save's wake-up: the log has something new (or soon will). Merge from here.
                    self._awaited[event.event_id] = time.monotonic()
                    self.read_due = True
                    self._retries = 0
                    break
                # The announcement of an event the log already gave: go past it.
                self.position = FeedPosition(self.position.log, event.cursor)
                continue
            self.position = FeedPosition(self.position.log, event.cursor)
            out.append(event.model_copy(update={"cursor": str(self.position)}))
        return self._fresh(out)

    def _fresh(self, events: list[AgentEvent]) -> list[AgentEvent]:
        """The events not handed out before; remembers them."""
        fresh: list[AgentEvent] = []
        for event in events:
            if event.event_id in self._recent:
                continue
            self._recent[event.event_id] = None
            if len(self._recent) > _REMEMBERED_IDS:
                self._recent.popitem(last=False)
            fresh.append(event)
        return fresh
