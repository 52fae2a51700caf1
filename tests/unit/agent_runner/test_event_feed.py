"""`EventFeed` over the in-memory log and live channel, and `InMemoryLiveEvents` itself."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from agent_runner import (
    DURABLE_EVENT_TYPES,
    EPHEMERAL_EVENT_TYPES,
    AgentEvent,
    AgentEventType,
    AgentTurn,
    EventFeed,
    InMemoryAgentTurnStore,
    InMemoryLiveEvents,
    InvalidCursorError,
    InvalidEventQueryError,
    StoreUnavailableError,
)
from agent_runner.feed import FeedFollower
from agent_runner.persistence import DEFAULT_EVENT_PAGE, EventScope
from tests.unit.agent_runner.feed_kit import CountingLog, Tree

E = AgentEventType


@pytest.fixture
def store() -> InMemoryAgentTurnStore:
    return InMemoryAgentTurnStore()


@pytest.fixture
def live() -> InMemoryLiveEvents:
    return InMemoryLiveEvents()


@pytest.fixture
def tree(store: InMemoryAgentTurnStore, live: InMemoryLiveEvents) -> Tree:
    return Tree(store, live)


def ids(events: list[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


# --- Event types ----------------------------------------------------------------------------------


def test_only_deltas_progress_projection_errors_admission_waits_and_unsaved_steering_are_ephemeral() -> None:
    ephemeral = {
        E.MODEL_DELTA,
        E.TOOL_PROGRESS,
        E.CHAT_MEMORY_ERROR,
        E.TURN_QUEUED,
        E.STEERING_ACCEPTED,
        E.STEERING_NOT_APPLIED,
    }
    assert {t for t in E if not t.is_durable} == EPHEMERAL_EVENT_TYPES == ephemeral
    assert DURABLE_EVENT_TYPES | EPHEMERAL_EVENT_TYPES == set(E)
    assert not E.CHAT_MEMORY_ERROR.is_durable and E.TURN_COMPLETED.is_durable


def test_an_event_from_a_runner_has_no_cursor_and_the_cursor_survives_json() -> None:
    event = AgentEvent(type=E.TURN_STARTED, turn_id="t")
    assert event.cursor is None
    read = event.model_copy(update={"cursor": "1.2:3-0"})
    assert AgentEvent.model_validate_json(read.model_dump_json()) == read


# --- The merge ------------------------------------------------------------------------------------


def test_durable_events_come_from_the_log_and_ephemeral_ones_from_the_live_channel(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    first = tree.delta("r-1", "Hel")
    second = tree.delta("r-1", "lo")
    (answer,) = tree.save("r-1", E.MODEL_RESPONSE)
    progress = tree.delta("r-1", "50%", E.TOOL_PROGRESS)
    (done,) = tree.save("r-1", E.TOOL_COMPLETED)
    # A delta that reached the store is not stored, and the store's copy of each durable
    # event is the only one the feed serves (the live channel also carries every save's wake-up)
    store.save(tree.turns["r-1"], tree.turns["r-1"].version, [AgentEvent(type=E.MODEL_DELTA, turn_id="r-1")])
    feed = EventFeed(store, live)
    expected = ["r-1:0:0", first.event_id, second.event_id, answer.event_id, progress.event_id, done.event_id]
    for scope in (EventScope.tree("r-1"), EventScope.conversation("c-1")):
        events = feed.read(scope)
        assert ids(events) == expected
        assert [e.type for e in events][1:] == [
            E.MODEL_DELTA,
            E.MODEL_DELTA,
            E.MODEL_RESPONSE,
            E.TOOL_PROGRESS,
            E.TOOL_COMPLETED,
        ]


def test_a_feed_without_a_live_channel_serves_the_durable_events(tree: Tree, store: InMemoryAgentTurnStore) -> None:
    tree.delta("r-1")
    tree.save("r-1", E.MODEL_RESPONSE)
    events = EventFeed(store).read(EventScope.tree("r-1"))
    assert ids(events) == ["r-1:0:0", "r-1:1:0"]
    assert ids(EventFeed(store).read(EventScope.tree("r-1"), after=events[0].cursor)) == ["r-1:1:0"]


def random_history(tree: Tree, seed: int, operations: int = 60) -> None:
    rng = random.Random(seed)
    children = ["r-1.a", "r-1.b"]
    for _ in range(operations):
        turn_id = rng.choice(["r-1", *children])
        if rng.random() < 0.5:
            tree.delta(turn_id, type=rng.choice([E.MODEL_DELTA, E.TOOL_PROGRESS]))
        else:
            tree.save(turn_id, *rng.choices([E.MODEL_RESPONSE, E.TOOL_STARTED, E.TOOL_COMPLETED], k=rng.randint(1, 3)))


@pytest.mark.parametrize("seed", range(5))
def test_reading_after_any_cursor_returns_exactly_what_followed(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents, seed: int
) -> None:
    random_history(tree, seed)
    feed = EventFeed(store, live)
    for scope in (EventScope.tree("r-1"), EventScope.conversation("c-1")):
        everything = feed.read(scope, limit=10_000)
        assert len(ids(everything)) == len(set(ids(everything)))
        # Interleaved by timestamp, each source in its own order
        assert [e.timestamp for e in everything] == sorted(e.timestamp for e in everything)
        for index, event in enumerate(everything):
            assert ids(feed.read(scope, after=event.cursor, limit=10_000)) == ids(everything[index + 1 :])
        # And small pages walk the same sequence
        for limit in (1, 2, 5):
            paged: list[str] = []
            cursor = None
            while page := feed.read(scope, after=cursor, limit=limit):
                assert len(page) <= limit
                paged += ids(page)
                cursor = page[-1].cursor
            assert paged == ids(everything)


def test_a_long_run_of_wake_ups_does_not_hide_the_ephemeral_events_behind_it(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    feed = EventFeed(store, live)
    start = feed.read(EventScope.tree("r-1"))[-1].cursor
    # Given a reader whose log cursor is past many saves, but whose live cursor is before their wake-ups
    for _ in range(12):
        tree.save("r-1", E.TOOL_STARTED)
    durable_now = feed.read(EventScope.tree("r-1"), after=start, limit=1000)
    log_part = durable_now[-1].cursor.partition(":")[0]  # type: ignore[union-attr]
    live_part = start.partition(":")[2]  # type: ignore[union-attr]
    behind = f"{log_part}:{live_part}"
    delta = tree.delta("r-1")
    # When it reads small pages, the delta after the wake-ups still comes
    assert ids(feed.read(EventScope.tree("r-1"), after=behind, limit=3)) == [delta.event_id]


def test_an_ephemeral_event_delivered_twice_is_served_once(store: InMemoryAgentTurnStore) -> None:
    live = InMemoryLiveEvents()
    store.save(AgentTurn(id="r-1", agent_id="a"), -1)
    delta = AgentEvent(type=E.MODEL_DELTA, turn_id="r-1", root_turn_id="r-1")
    live.publish(delta)
    live.publish(delta)
    feed = EventFeed(store, live)
    assert ids(feed.read(EventScope.tree("r-1"))) == [delta.event_id]
    assert ids(list(feed.follow(EventScope.tree("r-1"), timeout=0.05, poll_interval=0.01))) == [delta.event_id]


@pytest.mark.parametrize(
    "cursor", ["plain", "a:b:c", "x" * 300, "1 2:3", "é:", "1.2:3-0", ":1-0", "0.1:"], ids=lambda c: repr(c)[:20]
)
def test_a_cursor_this_feed_did_not_issue_is_refused(tree: Tree, cursor: str) -> None:
    with pytest.raises(InvalidCursorError):
        EventFeed(tree.store, tree.live).read(EventScope.tree("r-1"), after=cursor)


@pytest.mark.parametrize("make", [EventScope.tree, EventScope.conversation], ids=["tree", "conversation"])
def test_a_scope_with_an_empty_id_is_refused_when_it_is_built(make: Callable[[str], EventScope]) -> None:
    with pytest.raises(InvalidEventQueryError, match="must be a non-empty string"):
        make("")


def test_a_scope_of_another_kind_is_refused() -> None:
    with pytest.raises(InvalidEventQueryError, match="'tree' or a 'conversation'"):
        EventScope("root", "r-1")  # type: ignore[arg-type]


def test_scopes_are_values_that_key_what_is_kept_per_scope() -> None:
    assert EventScope.tree("r-1") == EventScope("tree", "r-1")
    assert len({EventScope.tree("x"), EventScope.tree("x"), EventScope.conversation("x")}) == 2
    assert str(EventScope.conversation("c-1")) == "conversation 'c-1'"


class FailingLive:
    """A live channel whose server is down."""

    def publish(self, event: AgentEvent) -> None:
        pass

    def read(self, scope: EventScope, **_: Any) -> list[AgentEvent]:
        raise StoreUnavailableError("the live channel is down")

    def wait(self, scope: EventScope, **_: Any) -> list[AgentEvent]:
        raise StoreUnavailableError("the live channel is down")


def test_a_failing_live_channel_leaves_the_durable_events_flowing(
    tree: Tree, store: InMemoryAgentTurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    feed = EventFeed(store, FailingLive())
    with caplog.at_level(logging.WARNING):
        events = feed.read(EventScope.tree("r-1"))
        followed = list(feed.follow(EventScope.tree("r-1"), timeout=0.1, poll_interval=0.02))
    assert ids(events) == ids(followed) == ["r-1:0:0"]
    assert events[0].cursor == "1:"
    assert "live event channel failed" in caplog.text


# --- Following ------------------------------------------------------------------------------------


def test_follow_yields_what_is_there_then_what_comes_and_stops_when_idle(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    feed = EventFeed(store, live)
    produced: list[str] = ["r-1:0:0"]

    def produce() -> None:
        for step in range(4):
            time.sleep(0.03)
            produced.append(tree.delta("r-1").event_id)
            produced.extend(ids(tree.save("r-1", E.MODEL_RESPONSE)))
            if step == 1:
                produced.extend(ids(tree.save("r-1.a")))

    producer = threading.Thread(target=produce)
    producer.start()
    followed = list(feed.follow(EventScope.conversation("c-1"), timeout=1.0, poll_interval=0.05))
    producer.join()
    assert ids(followed) == produced
    # Following again from the last cursor finds nothing new and ends after the idle time
    assert list(feed.follow(EventScope.conversation("c-1"), after=followed[-1].cursor, timeout=0.1)) == []
    # And resuming from the middle yields exactly the rest
    middle = len(followed) // 2
    assert (
        ids(list(feed.follow(EventScope.conversation("c-1"), after=followed[middle].cursor, timeout=0.1)))
        == produced[middle + 1 :]
    )


def test_follow_without_a_live_channel_polls_the_log(tree: Tree, store: InMemoryAgentTurnStore) -> None:
    feed = EventFeed(store)
    timer = threading.Timer(0.05, lambda: tree.save("r-1", E.TURN_COMPLETED))
    timer.start()
    followed = list(feed.follow(EventScope.tree("r-1"), timeout=0.5, poll_interval=0.01))
    timer.join()
    assert ids(followed) == ["r-1:0:0", "r-1:1:0"]


def test_follow_refuses_a_non_positive_poll_interval(tree: Tree) -> None:
    with pytest.raises(ValueError):
        next(EventFeed(tree.store).follow(EventScope.tree("r-1"), timeout=1, poll_interval=0))


# --- What following reads -------------------------------------------------------------------------


@pytest.fixture
def counting(store: InMemoryAgentTurnStore) -> CountingLog:
    return CountingLog(store)


def test_deltas_come_straight_from_the_live_channel_without_reading_the_log(
    tree: Tree, live: InMemoryLiveEvents, counting: CountingLog
) -> None:
    # Given a follower that has read the log once (the poll is far away)
    followed = EventFeed(counting, live).follow(EventScope.conversation("c-1"), timeout=5, poll_interval=60)
    assert next(followed).event_id == "r-1:0:0"
    assert counting.reads == 1
    # When a model streams 50 deltas
    deltas = [tree.delta("r-1", f"t{n}") for n in range(50)]
    # Then every delta is followed, in order, and the log was not read again
    assert [next(followed).event_id for _ in deltas] == ids(deltas)
    assert counting.reads == 1
    followed.close()


def test_a_saves_wake_up_brings_its_durable_events_at_once(
    tree: Tree, live: InMemoryLiveEvents, counting: CountingLog
) -> None:
    follower = FeedFollower(EventFeed(counting, live), EventScope.conversation("c-1"), poll_interval=60)
    assert ids(follower.next_batch(1)) == ["r-1:0:0"]
    # A producer saves from another thread while the follower waits (the poll is a minute away)
    timer = threading.Timer(0.05, lambda: tree.save("r-1", E.MODEL_RESPONSE, E.TOOL_STARTED))
    started = time.monotonic()
    timer.start()
    batch = follower.next_batch(10)
    waited = time.monotonic() - started
    timer.join()
    # One read of the log brings both events of the save, well before the poll
    assert ids(batch) == ["r-1:1:0", "r-1:1:1"]
    assert waited < 2 and counting.reads == 2


def test_an_announced_event_the_log_does_not_show_yet_is_looked_for_again_soon(
    tree: Tree, live: InMemoryLiveEvents, counting: CountingLog
) -> None:
    follower = FeedFollower(EventFeed(counting, live), EventScope.tree("r-1"), poll_interval=60)
    assert ids(follower.next_batch(1)) == ["r-1:0:0"]
    # Given a save whose event stays unreadable for a while after its wake-up
    counting.hide.add("r-1:1:0")
    tree.save("r-1", E.TOOL_COMPLETED)
    threading.Timer(0.1, counting.hide.clear).start()
    started = time.monotonic()
    # Then it comes within a few re-reads of the log, long before the poll
    assert ids(follower.next_batch(10)) == ["r-1:1:0"]
    assert time.monotonic() - started < 2
    assert 2 < counting.reads < 12
    # And once it came, the re-reads stop
    reads = counting.reads
    assert follower.next_batch(0.3) == []
    assert counting.reads == reads


def test_without_wake_ups_the_log_is_still_polled(store: InMemoryAgentTurnStore, counting: CountingLog) -> None:
    # A live channel that never hears of the save (a wake-up lost, or a process without a channel)
    tree = Tree(store, InMemoryLiveEvents())
    follower = FeedFollower(EventFeed(counting, InMemoryLiveEvents()), EventScope.tree("r-1"), poll_interval=0.05)
    assert ids(follower.next_batch(1)) == ["r-1:0:0"]
    tree.save("r-1", E.TURN_COMPLETED)
    assert ids(follower.next_batch(2)) == ["r-1:1:0"]


def test_a_delta_after_a_wake_up_comes_after_the_durable_event(tree: Tree, store: InMemoryAgentTurnStore) -> None:
    live = tree.live
    follower = FeedFollower(EventFeed(store, live), EventScope.conversation("c-1"), poll_interval=60)
    follower.next_batch(1)
    before = tree.delta("r-1")
    (saved,) = tree.save("r-1", E.MODEL_RESPONSE)
    after = tree.delta("r-1")
    followed: list[AgentEvent] = []
    while batch := follower.next_batch(0.05):
        followed += batch
    assert ids(followed) == [before.event_id, saved.event_id, after.event_id]


def test_an_events_cursor_is_the_same_whether_its_wake_up_was_published_yet_or_not(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    tree.delta("r-1", "Hel")
    feed = EventFeed(store, live)
    publish = live.publish
    live.publish = lambda event: None  # type: ignore[method-assign]  # committed, not announced yet
    (response,) = tree.save("r-1", E.MODEL_RESPONSE)
    before = feed.read(EventScope.tree("r-1"))
    publish(response)
    after = feed.read(EventScope.tree("r-1"))
    assert [e.type for e in after] == [E.TURN_STARTED, E.MODEL_DELTA, E.MODEL_RESPONSE]
    assert [(e.event_id, e.cursor) for e in after] == [(e.event_id, e.cursor) for e in before]
    # Reading on from that cursor repeats nothing, whichever read it came from
    assert feed.read(EventScope.tree("r-1"), after=before[-1].cursor) == []


def test_deltas_streamed_while_a_page_is_read_come_before_the_answer_saved_after_them(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    """The model call streams its last delta and its answer is saved between the page's live and log reads."""
    first = tree.delta("r-1", "Hel")
    acted: list[AgentEvent] = []

    class Racing:
        def read_events(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
            if not acted:
                acted.append(tree.delta("r-1", "lo"))
                acted.extend(tree.save("r-1", E.MODEL_RESPONSE))
            return store.read_events(scope, **query)

    feed = EventFeed(Racing(), live)
    page = feed.read_page(EventScope.tree("r-1"))
    last, answer = acted
    assert ids(page.events) == ["r-1:0:0", first.event_id, last.event_id, answer.event_id]
    assert feed.read_page(EventScope.tree("r-1"), after=page.end).events == []


def test_a_save_announced_after_the_log_was_read_holds_back_the_deltas_streamed_after_it(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    """A tool result is saved and the next model call streams just after the page read the log."""
    acted: list[AgentEvent] = []

    class Racing:
        def read_events(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
            found = store.read_events(scope, **query)
            if not acted:
                acted.extend(tree.save("r-1", E.TOOL_COMPLETED))
                acted.append(tree.delta("r-1", "Hel"))
            return found

    feed = EventFeed(Racing(), live)
    page = feed.read_page(EventScope.tree("r-1"))
    completed, delta = acted
    assert ids(page.events) == ["r-1:0:0"] and page.more
    rest = feed.read_page(EventScope.tree("r-1"), after=page.end)
    assert ids(rest.events) == [completed.event_id, delta.event_id]


def test_a_save_committed_between_the_reads_of_a_page_still_comes_before_the_deltas_after_it(
    tree: Tree, store: InMemoryAgentTurnStore
) -> None:
    """A runner saves a tool result and streams the next model call while a page is being read."""
    tree.save("r-1", E.TURN_RESUMED)
    live = tree.live
    acted: list[AgentEvent] = []

    class Racing:
        def read(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
            if not acted:
                acted.extend(tree.save("r-1", E.TOOL_COMPLETED))
                acted.append(tree.delta("r-1", "Hel"))
            return live.read(scope, **query)

        def wait(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
            return live.wait(scope, **query)

    page = EventFeed(store, Racing()).read_page(EventScope.tree("r-1"))  # type: ignore[arg-type]
    completed, delta = acted
    assert [e.type for e in page.events] == [E.TURN_STARTED, E.TURN_RESUMED, E.TOOL_COMPLETED, E.MODEL_DELTA]
    assert ids(page.events[2:]) == [completed.event_id, delta.event_id]


@pytest.mark.parametrize("seed", range(6))
def test_following_gives_what_reading_gives_and_reads_the_log_once_per_save(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents, counting: CountingLog, seed: int
) -> None:
    # Given a follower that takes what there is between random deltas and saves of a tree
    rng = random.Random(seed)
    feed = EventFeed(counting, live)
    follower = FeedFollower(feed, EventScope.conversation("c-1"), poll_interval=60)
    followed: list[AgentEvent] = []
    saves = 0
    for _ in range(80):
        turn_id = rng.choice(["r-1", "r-1.a", "r-1.b"])
        roll = rng.random()
        if roll < 0.5:
            tree.delta(turn_id, type=rng.choice([E.MODEL_DELTA, E.TOOL_PROGRESS]))
        elif roll < 0.8:
            tree.save(turn_id, *rng.choices([E.MODEL_RESPONSE, E.TOOL_STARTED, E.TOOL_COMPLETED], k=rng.randint(1, 3)))
            saves += 1
        else:
            while batch := follower.next_batch(0.001):
                followed += batch
    while batch := follower.next_batch(0.001):
        followed += batch
    # Then the log was read once at the start and at most once per save
    assert counting.reads <= 1 + saves
    # And it followed exactly what a read of everything returns, in the same order
    everything = EventFeed(store, live).read(EventScope.conversation("c-1"), limit=10_000)
    assert ids(followed) == ids(everything)
    # And each cursor it handed out resumes with exactly the rest
    for index, event in enumerate(followed):
        assert ids(feed.read(EventScope.conversation("c-1"), after=event.cursor, limit=10_000)) == ids(
            followed[index + 1 :]
        )


# --- InMemoryLiveEvents ---------------------------------------------------------------------------


def live_event(root: str = "r-1", conversation: str | None = "c-1", **fields: Any) -> AgentEvent:
    return AgentEvent(
        type=E.MODEL_DELTA,
        turn_id=fields.pop("turn_id", root),
        root_turn_id=root,
        conversation_id=conversation,
        **fields,
    )


def test_live_events_are_kept_per_tree_and_per_conversation_in_publish_order(live: InMemoryLiveEvents) -> None:
    a, b = live_event(), live_event(turn_id="r-1.child")
    other = live_event("r-2", "c-2")
    lonely = live_event("r-3", None)
    for published in (a, other, b, lonely):
        live.publish(published)
    by_tree = live.read(EventScope.tree("r-1"))
    assert ids(by_tree) == [a.event_id, b.event_id]
    assert ids(live.read(EventScope.conversation("c-1"))) == [a.event_id, b.event_id]
    assert ids(live.read(EventScope.tree("r-3"))) == [lonely.event_id]
    assert ids(live.read(EventScope.tree("r-1"), after=by_tree[0].cursor)) == [b.event_id]
    assert live.read(EventScope.tree("r-1"), after=by_tree[1].cursor) == []
    assert ids(live.read(EventScope.tree("r-1"), limit=1)) == [a.event_id]
    assert by_tree[0].model_copy(update={"cursor": None}) == a


def test_live_wait_returns_at_once_blocks_until_a_publish_or_times_out(live: InMemoryLiveEvents) -> None:
    first = live_event()
    live.publish(first)
    # Something after the cursor: no waiting
    assert ids(live.wait(EventScope.tree("r-1"), timeout=5)) == [first.event_id]
    cursor = live.read(EventScope.tree("r-1"))[-1].cursor
    # Nothing: an empty list once the time is up
    assert live.wait(EventScope.tree("r-1"), after=cursor, timeout=0.05) == []
    # A publish from another thread wakes the waiter
    second = live_event()
    timer = threading.Timer(0.05, live.publish, args=(second,))
    timer.start()
    woke = live.wait(
        EventScope.conversation("c-1"), after=live.read(EventScope.conversation("c-1"))[-1].cursor, timeout=10
    )
    timer.join()
    assert ids(woke) == [second.event_id]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_live_events_are_kept_for_the_retention_then_dropped() -> None:
    clock = FakeClock()
    live = InMemoryLiveEvents(retention_s=300, clock=clock)
    old = live_event()
    live.publish(old)
    clock.now += 299
    recent = live_event()
    live.publish(recent)
    assert ids(live.read(EventScope.tree("r-1"))) == [old.event_id, recent.event_id]
    clock.now += 2
    assert ids(live.read(EventScope.tree("r-1"))) == [recent.event_id]
    # Scopes nobody reads are dropped by later publishes once expired
    live.publish(live_event("r-9", None))
    clock.now += 301
    live.publish(live_event("r-8", None))
    assert live.read(EventScope.conversation("c-1")) == [] and live.read(EventScope.tree("r-9")) == []


def test_live_events_are_bounded_per_scope() -> None:
    live = InMemoryLiveEvents(max_events_per_scope=3)
    published = [live_event() for _ in range(10)]
    for event in published:
        live.publish(event)
    assert ids(live.read(EventScope.tree("r-1"))) == ids(published[-3:])
    assert ids(live.read(EventScope.conversation("c-1"))) == ids(published[-3:])


def test_publishing_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    def broken_clock() -> float:
        raise RuntimeError("clock failure")

    live = InMemoryLiveEvents(clock=time.monotonic)
    live._clock = broken_clock
    with caplog.at_level(logging.ERROR):
        live.publish(live_event())
    assert "publishing live event" in caplog.text


@pytest.mark.parametrize("cursor", ["", "x", "-1", "1.2", "1-0"])
def test_a_live_cursor_of_another_shape_is_refused(live: InMemoryLiveEvents, cursor: str) -> None:
    with pytest.raises(InvalidCursorError):
        live.read(EventScope.tree("r-1"), after=cursor)
    with pytest.raises(InvalidCursorError):
        live.wait(EventScope.tree("r-1"), after=cursor, timeout=0)


@pytest.mark.parametrize("arguments", [{"retention_s": 0}, {"max_events_per_scope": 0}])
def test_live_bounds_must_be_positive(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        InMemoryLiveEvents(**arguments)  # type: ignore[arg-type]


# --- Pages: ties, full pages, backlogs -------------------------------------------------------------


def test_a_delta_and_a_save_of_the_same_instant_come_delta_first(tree: Tree, store: InMemoryAgentTurnStore) -> None:
    # A runner publishes a model call's deltas before it saves the answer; on a clock too
    # coarse to tell them apart, the merge keeps that order.
    delta = tree.delta("r-1", "last words")
    tree.clock -= timedelta(milliseconds=1)  # the save's event gets the delta's timestamp
    (answer,) = tree.save("r-1", E.MODEL_RESPONSE)
    assert answer.timestamp == delta.timestamp
    page = EventFeed(store, tree.live).read_page(EventScope.tree("r-1"), limit=100)
    assert ids(page.events) == ["r-1:0:0", delta.event_id, answer.event_id]


def test_a_page_filled_by_both_sources_says_more_may_follow(tree: Tree, store: InMemoryAgentTurnStore) -> None:
    # Neither source returns a full page, but together they fill it: the rest is on the next page
    deltas = [tree.delta("r-1", text) for text in "abc"]
    (answer,) = tree.save("r-1", E.MODEL_RESPONSE)
    feed = EventFeed(store, tree.live)
    first = feed.read_page(EventScope.tree("r-1"), limit=4)
    assert ids(first.events) == ["r-1:0:0", *ids(deltas)] and first.more
    second = feed.read_page(EventScope.tree("r-1"), after=first.end, limit=4)
    assert ids(second.events) == [answer.event_id] and not second.more


def test_a_full_log_page_with_newer_live_events_stops_where_the_log_page_ends(
    tree: Tree, store: InMemoryAgentTurnStore
) -> None:
    saved = [event for _ in range(4) for event in tree.save("r-1", E.MODEL_RESPONSE)]
    deltas = [tree.delta("r-1", text) for text in "xy"]
    feed = EventFeed(store, tree.live)
    first = feed.read_page(EventScope.tree("r-1"), limit=5)
    assert ids(first.events) == ["r-1:0:0", *ids(saved)] and first.more
    rest = feed.read_page(EventScope.tree("r-1"), after=first.end, limit=5)
    assert ids(rest.events) == ids(deltas) and not rest.more


def test_a_follower_reads_a_backlog_of_full_pages_without_waiting_between_them(
    tree: Tree, store: InMemoryAgentTurnStore
) -> None:
    for _ in range(2 * DEFAULT_EVENT_PAGE + 10):
        tree.save("r-1", E.MODEL_RESPONSE)
    # No live channel to announce the saves, and a poll interval far longer than the test:
    # a wait between pages would show as an empty batch
    follower = FeedFollower(EventFeed(store, None), EventScope.tree("r-1"), poll_interval=600)
    batches = [follower.next_batch(5.0) for _ in range(3)]
    assert [len(batch) for batch in batches] == [DEFAULT_EVENT_PAGE, DEFAULT_EVENT_PAGE, 11]
