"""Event streams of one scope share one follower of the feed (`workers.api.fanout`), on the in-memory feed.

The streams here are the SSE routes' `_Stream`s, driven on an asyncio loop as the server
drives them; the producer saves and publishes from another thread, as a runner does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_runner import (
    AgentEvent,
    AgentEventType,
    EventFeed,
    EventScope,
    InMemoryAgentTurnStore,
    InMemoryLiveEvents,
    StoreError,
)
from tests.unit.agent_runner.feed_kit import CountingLog, Tree
from workers.api.event_streams import _Stream
from workers.api.fanout import EventFanout

E = AgentEventType
CONVERSATION = EventScope.conversation("c-1")


@pytest.fixture
def store() -> InMemoryAgentTurnStore:
    return InMemoryAgentTurnStore()


@pytest.fixture
def live() -> InMemoryLiveEvents:
    return InMemoryLiveEvents()


@pytest.fixture
def tree(store: InMemoryAgentTurnStore, live: InMemoryLiveEvents) -> Tree:
    return Tree(store, live)


@pytest.fixture
def counting(store: InMemoryAgentTurnStore) -> CountingLog:
    return CountingLog(store)


@pytest.fixture
def fanout(counting: CountingLog, live: InMemoryLiveEvents) -> Iterator[EventFanout]:
    shared = EventFanout(EventFeed(counting, live), poll_interval=60, linger=0.2)
    yield shared
    shared.close()


def ids(events: list[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


async def take(stream: _Stream, count: int, timeout: float = 10.0) -> list[AgentEvent]:
    """The next `count` events of the stream (fails if they do not come in time)."""
    taken: list[AgentEvent] = []
    deadline = time.monotonic() + timeout
    while len(taken) < count:
        assert time.monotonic() < deadline, f"only {len(taken)} of {count} events came: {ids(taken)}"
        taken += await stream.next_events(0.5)
    assert len(taken) == count, ids(taken)
    return taken


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def produce(tree: Tree, deltas: int, every: int = 5) -> list[AgentEvent]:
    """Deltas, and a save after every `every` of them (as a streaming model's turn), from this thread."""
    made: list[AgentEvent] = []
    for n in range(deltas):
        made.append(tree.delta("r-1", f"t{n}"))
        if n % every == every - 1:
            made += tree.save("r-1", E.MODEL_RESPONSE)
    return made


def subscribers(fanout: EventFanout) -> int:
    return sum(len(follower.subscribers) for follower in fanout._followers.values())


def test_many_streams_of_one_conversation_share_one_follower_and_its_reads(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents, counting: CountingLog, fanout: EventFanout
) -> None:
    async def scenario() -> tuple[list[list[AgentEvent]], list[AgentEvent], int]:
        # Given 50 streams of the conversation, caught up and following
        streams = [_Stream(fanout.feed, fanout, CONVERSATION, None) for _ in range(50)]
        firsts = [await take(stream, 1) for stream in streams]
        waiting = [asyncio.create_task(take(stream, 60)) for stream in streams]
        await until(lambda: subscribers(fanout) == 50)
        assert fanout.scopes() == [CONVERSATION]
        reads = counting.reads
        # When a turn streams 50 deltas with a save after every 5
        made = await asyncio.to_thread(produce, tree, 50)
        followed = await asyncio.gather(*waiting)
        return [first + rest for first, rest in zip(firsts, followed, strict=True)], made, counting.reads - reads

    followed, made, reads = asyncio.run(scenario())
    # Then every stream got every event, in the same order, the order a read gives
    everything = EventFeed(store, live).read(CONVERSATION, limit=10_000)
    assert ids(everything) == ["r-1:0:0", *ids(made)]
    assert all(ids(events) == ids(everything) for events in followed)
    # And the log was read about once per save for them all, not once per stream
    assert reads <= 10 + 2
    # And every cursor a stream got resumes with exactly the rest
    for index, event in enumerate(followed[0]):
        assert ids(EventFeed(store, live).read(CONVERSATION, after=event.cursor, limit=10_000)) == ids(
            everything[index + 1 :]
        )


def test_a_stream_that_comes_later_catches_up_then_joins_the_same_follower(
    tree: Tree, store: InMemoryAgentTurnStore, fanout: EventFanout
) -> None:
    async def scenario() -> tuple[list[AgentEvent], list[AgentEvent]]:
        first = _Stream(fanout.feed, fanout, CONVERSATION, None)
        await take(first, 1)
        assert await first.next_events(0.05) == []  # caught up: it joins the follower and waits there
        assert subscribers(fanout) == 1
        made = await asyncio.to_thread(produce, tree, 20)
        early = await take(first, len(made))
        # A client reconnects with the cursor of an event in the middle
        late = _Stream(fanout.feed, fanout, CONVERSATION, early[9].cursor)
        caught_up = await take(late, len(made) - 10)
        assert await late.next_events(0.05) == []
        assert subscribers(fanout) == 2
        more = await asyncio.to_thread(produce, tree, 10)
        return caught_up + await take(late, len(more)), early + await take(first, len(more))

    late, early = asyncio.run(scenario())
    assert ids(late) == ids(early[10:])
    assert len(fanout.scopes()) == 1


def test_a_stream_left_behind_by_the_ring_reads_what_it_missed(
    tree: Tree, counting: CountingLog, live: InMemoryLiveEvents
) -> None:
    fanout = EventFanout(EventFeed(counting, live), poll_interval=60, ring=4)

    async def scenario() -> tuple[list[AgentEvent], list[AgentEvent]]:
        slow, quick = (_Stream(fanout.feed, fanout, CONVERSATION, None) for _ in range(2))
        for stream in (slow, quick):
            await take(stream, 1)
            assert await stream.next_events(0.05) == []
        assert subscribers(fanout) == 2
        made = await asyncio.to_thread(produce, tree, 30)
        # The quick one keeps up; the slow one takes nothing until the ring has moved on
        quick_took = await take(quick, len(made))
        return await take(slow, len(made)), quick_took

    try:
        slow, quick = asyncio.run(scenario())
    finally:
        fanout.close()
    assert ids(slow) == ids(quick)
    assert len(set(ids(slow))) == len(slow) == 36


def test_beyond_the_shared_followers_a_stream_follows_alone(tree: Tree, counting: CountingLog) -> None:
    fanout = EventFanout(EventFeed(counting, tree.live), max_scopes=1, poll_interval=60)

    async def scenario() -> tuple[list[AgentEvent], list[AgentEvent]]:
        by_tree = _Stream(fanout.feed, fanout, EventScope.tree("r-1"), None)
        by_conversation = _Stream(fanout.feed, fanout, CONVERSATION, None)
        await take(by_tree, 1)
        await take(by_conversation, 1)
        assert await by_tree.next_events(0.05) == []
        assert await by_conversation.next_events(0.05) == []
        assert by_conversation._alone is not None and by_conversation._subscription is None
        made = await asyncio.to_thread(produce, tree, 10)
        return await take(by_tree, len(made)), await take(by_conversation, len(made))

    try:
        shared, alone = asyncio.run(scenario())
        assert fanout.scopes() == [EventScope.tree("r-1")]
    finally:
        fanout.close()
    assert ids(shared) == ids(alone)


def test_a_follower_stops_soon_after_its_last_stream_left(tree: Tree, fanout: EventFanout) -> None:
    async def scenario() -> None:
        stream = _Stream(fanout.feed, fanout, CONVERSATION, None)
        await take(stream, 1)
        await stream.next_events(0.05)
        assert fanout.scopes() == [CONVERSATION]
        stream.leave()
        await until(lambda: fanout.scopes() == [], timeout=5)

    asyncio.run(scenario())


def test_a_stream_whose_client_left_mid_wait_stops_waiting_with_it(tree: Tree, fanout: EventFanout) -> None:
    # The SSE route waits through `unless_closing`; a client that goes away cancels that
    # wait, and the route leaves the stream. The read must end there too: left running, it
    # would wake after its timeout on a stream it no longer has ("Task exception was never
    # retrieved" in the server's log).
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        failures: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: failures.append(context))
        stream = _Stream(fanout.feed, fanout, CONVERSATION, None)
        await take(stream, 1)
        reads = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        waiting = asyncio.ensure_future(fanout.unless_closing(stream.next_events(0.3)))
        await asyncio.sleep(0.05)
        inner = [
            t for t in asyncio.all_tasks() if t not in reads and t is not asyncio.current_task() and t is not waiting
        ]
        assert inner, "the wait runs its read as a task of its own"
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        stream.leave()
        await asyncio.sleep(0.5)  # past the read's own timeout
        assert all(task.done() and task.cancelled() for task in inner)
        assert failures == []

    asyncio.run(scenario())


class BreakingLog:
    """A log that fails once told to."""

    def __init__(self, store: InMemoryAgentTurnStore) -> None:
        self.store = store
        self.broken = threading.Event()

    def read_events(self, scope: EventScope, **query: Any) -> list[AgentEvent]:
        if self.broken.is_set():
            raise StoreError("the database went away")
        return self.store.read_events(scope, **query)


def test_when_the_shared_follower_fails_its_streams_read_on_their_own(
    tree: Tree, store: InMemoryAgentTurnStore, live: InMemoryLiveEvents
) -> None:
    log = BreakingLog(store)
    fanout = EventFanout(EventFeed(log, live), poll_interval=0.05)

    async def scenario() -> None:
        stream = _Stream(fanout.feed, fanout, CONVERSATION, None)
        await take(stream, 1)
        assert await stream.next_events(0.05) == []
        assert subscribers(fanout) == 1
        log.broken.set()
        # The follower's next read fails: the stream is let go, and its own read fails as the route's would
        with pytest.raises(StoreError):
            for _ in range(50):
                await stream.next_events(0.1)

    try:
        asyncio.run(scenario())
        assert fanout.scopes() == []
    finally:
        fanout.close()
