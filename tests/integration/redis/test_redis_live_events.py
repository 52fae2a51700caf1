"""The live event channel: `RedisLiveEvents` on a real server, and `InMemoryLiveEvents` under the same tests."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentTurn,
    EventFeed,
    InMemoryAgentTurnStore,
    InMemoryLiveEvents,
    InvalidCursorError,
    StoreUnavailableError,
)
from agent_runner.feed import FeedFollower
from agent_runner.persistence import ConversationKey, EventScope, LiveEventChannel
from store import RedisLiveEvents
from store.keys import RedisKeys
from tests.unit.agent_runner.feed_kit import CountingLog

pytestmark = pytest.mark.integration

E = AgentEventType


@pytest.fixture(params=["redis", "memory"])
def live(request: pytest.FixtureRequest) -> Iterator[LiveEventChannel]:
    if request.param == "memory":
        yield InMemoryLiveEvents()
        return
    redis_url = request.getfixturevalue("redis_url")
    keys: RedisKeys = request.getfixturevalue("keys")
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as channel:
        yield channel


def delta(root: str = "r-1", conversation: str | None = "c-1", **fields: Any) -> AgentEvent:
    return AgentEvent(
        type=fields.pop("type", E.MODEL_DELTA),
        turn_id=fields.pop("turn_id", root),
        root_turn_id=root,
        conversation_id=conversation,
        data=fields,
    )


def ids(events: list[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


def test_published_events_are_read_per_tree_and_per_conversation_in_order(live: LiveEventChannel) -> None:
    # Given events of a root, of its child (with the root's conversation), of another tree, and of a tree alone
    a, child = delta(text="Hel"), delta(turn_id="r-1.a", text="lo")
    other, alone = delta("r-2", "c-2"), delta("r-3", None)
    for event in (a, other, child, alone):
        live.publish(event)
    # Then each scope holds its own, oldest first, each with a cursor, otherwise as published
    by_tree = live.read(EventScope.tree("r-1"))
    assert ids(by_tree) == [a.event_id, child.event_id]
    assert ids(live.read(EventScope.conversation("c-1"))) == [a.event_id, child.event_id]
    assert ids(live.read(EventScope.conversation("c-2"))) == [other.event_id]
    assert ids(live.read(EventScope.tree("r-3"))) == [alone.event_id]
    assert live.read(EventScope.tree("r-1.a")) == []
    assert [e.model_copy(update={"cursor": None}) for e in by_tree] == [a, child]
    assert all(e.cursor for e in by_tree)


def test_reading_after_a_cursor_returns_what_followed(live: LiveEventChannel) -> None:
    published = [delta(n=n) for n in range(6)]
    for event in published:
        live.publish(event)
    read = live.read(EventScope.conversation("c-1"))
    for index, event in enumerate(read):
        assert ids(live.read(EventScope.conversation("c-1"), after=event.cursor)) == ids(published[index + 1 :])
    assert ids(live.read(EventScope.conversation("c-1"), limit=2)) == ids(published[:2])
    assert live.read(EventScope.conversation("c-1"), limit=0) == []


def test_wait_returns_at_once_wakes_on_a_publish_and_times_out(live: LiveEventChannel) -> None:
    first = delta()
    live.publish(first)
    # An event after the cursor is returned without waiting
    assert ids(live.wait(EventScope.tree("r-1"), timeout=10)) == [first.event_id]
    cursor = live.read(EventScope.tree("r-1"))[-1].cursor
    # Nothing new: the wait ends empty after the timeout (and at once with no timeout)
    assert live.wait(EventScope.tree("r-1"), after=cursor, timeout=0.2) == []
    assert live.wait(EventScope.tree("r-1"), after=cursor, timeout=0) == []
    # An event published by another thread while waiting wakes the waiter. A cursor
    # belongs to the scope it was read from (the tree's and the conversation's streams
    # number their entries apart), so the conversation is waited on after its own cursor.
    conversation_cursor = live.read(EventScope.conversation("c-1"))[-1].cursor
    second = delta(type=E.TOOL_PROGRESS)
    timer = threading.Timer(0.1, live.publish, args=(second,))
    timer.start()
    woke = live.wait(EventScope.conversation("c-1"), after=conversation_cursor, timeout=20)
    timer.join()
    assert ids(woke) == [second.event_id]


def test_waiting_on_a_scope_nobody_published_to_times_out(live: LiveEventChannel) -> None:
    assert live.wait(EventScope.conversation("nobody"), timeout=0.1) == []


@pytest.mark.parametrize("cursor", ["", "x", "1.2.3", "-1", "1-x", "a-1"])
def test_a_cursor_of_another_shape_is_refused(live: LiveEventChannel, cursor: str) -> None:
    with pytest.raises(InvalidCursorError):
        live.read(EventScope.tree("r-1"), after=cursor)


def test_a_scope_reads_the_stream_its_key_names(keys: RedisKeys) -> None:
    assert keys.events(EventScope.tree("r-1")) == keys.turn_events("r-1")
    assert keys.events(EventScope.conversation("c-1")) == keys.conversation_events(ConversationKey("c-1"))
    # A tenant's conversation has a stream of its own, named as earlier versions named it
    tenants = keys.events(EventScope.conversation("c-1", "acme"))
    assert (
        tenants
        == keys.conversation_events(ConversationKey("c-1", "acme"))
        == f"{keys.prefix}:conversation:{{acme/c-1}}:events"
    )
    assert tenants != keys.events(EventScope.conversation("c-1")) != keys.events(EventScope.conversation("c-1", "b"))


def test_two_tenants_using_one_conversation_id_read_their_own_live_events(live: LiveEventChannel) -> None:
    for tenant in ("acme", "globex"):
        live.publish(
            AgentEvent(
                event_id=f"e-{tenant}",
                type=AgentEventType.MODEL_DELTA,
                turn_id=f"t-{tenant}",
                conversation_id="c-1",
                tenant_id=tenant,
            )
        )
    assert [e.event_id for e in live.read(EventScope.conversation("c-1", "acme"))] == ["e-acme"]
    assert [e.event_id for e in live.read(EventScope.conversation("c-1", "globex"))] == ["e-globex"]
    assert live.read(EventScope.conversation("c-1")) == []


def test_a_feed_merges_the_redis_channel_with_the_durable_log(redis_url: str, keys: RedisKeys) -> None:
    store = InMemoryAgentTurnStore()
    turn = AgentTurn(id="r-1", agent_id="a", conversation_id="c-1")
    started = AgentEvent(event_id="r-1:0:0", type=E.TURN_STARTED, turn_id="r-1", conversation_id="c-1")
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        store.save(turn, -1, [started])
        live.publish(started)
        first = delta()
        live.publish(first)
        feed = EventFeed(store, live)
        events = feed.read(EventScope.tree("r-1"))
        assert ids(events) == ["r-1:0:0", first.event_id]
        # Follow from the last cursor: a delta from another thread arrives through XREAD BLOCK
        later = delta()
        timer = threading.Timer(0.1, live.publish, args=(later,))
        timer.start()
        followed = feed.follow(EventScope.tree("r-1"), after=events[-1].cursor, timeout=20, poll_interval=5)
        assert next(followed).event_id == later.event_id
        followed.close()  # end the follow
        timer.join()


def test_following_reads_the_log_for_saves_only_not_for_deltas(live: LiveEventChannel) -> None:
    # Given a follower of a conversation on this channel, over a log that counts its reads
    store = InMemoryAgentTurnStore()
    log = CountingLog(store)
    turn = AgentTurn(id="r-1", agent_id="a", conversation_id="c-1")
    started = AgentEvent(event_id="r-1:0:0", type=E.TURN_STARTED, turn_id="r-1", conversation_id="c-1")
    store.save(turn, -1, [started])
    live.publish(started)
    follower = FeedFollower(EventFeed(log, live), EventScope.conversation("c-1"), poll_interval=30)
    assert ids(follower.next_batch(5)) == ["r-1:0:0"]
    reads = log.reads
    # When 30 deltas are published from another thread, a few milliseconds apart
    deltas = [delta(n=n) for n in range(30)]

    def stream() -> None:
        for event in deltas:
            live.publish(event)
            time.sleep(0.002)

    producer = threading.Thread(target=stream)
    producer.start()
    followed: list[AgentEvent] = []
    while len(followed) < len(deltas):
        batch = follower.next_batch(10)
        assert batch, "the deltas stopped coming"
        followed += batch
    producer.join()
    # Then they all came, and the log was not read for them
    assert ids(followed) == ids(deltas)
    assert log.reads == reads
    # And a save's wake-up brings its event at once, with one read (the poll is 30 s away)
    answer = AgentEvent(event_id="r-1:1:0", type=E.MODEL_RESPONSE, turn_id="r-1", conversation_id="c-1")
    store.save(store.load("r-1"), 0, [answer])
    timer = threading.Timer(0.05, live.publish, args=(answer,))
    started_at = time.monotonic()
    timer.start()
    assert ids(follower.next_batch(10)) == ["r-1:1:0"]
    timer.join()
    assert time.monotonic() - started_at < 5
    assert log.reads == reads + 1


# --- Redis specifics ------------------------------------------------------------------------------


def test_streams_live_under_the_prefix_and_expire_after_the_retention(
    redis_url: str, keys: RedisKeys, redis_client: Redis[Any]
) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix, retention_s=120) as live:
        live.publish(delta())
    tree, conversation = keys.turn_events("r-1"), keys.conversation_events(ConversationKey("c-1"))
    assert {k.decode() for k in redis_client.scan_iter(match=keys.pattern())} == {tree, conversation}
    for key in (tree, conversation):
        # Each publish sets the stream to expire the retention after it
        assert 110_000 < redis_client.pttl(key) <= 120_000
        assert redis_client.xlen(key) == 1


def test_streams_are_trimmed_near_their_maximum_length(
    redis_url: str, keys: RedisKeys, redis_client: Redis[Any]
) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix, maxlen=10) as live:
        for n in range(1000):
            live.publish(delta(n=n))
        kept = live.read(EventScope.tree("r-1"), limit=10_000)
    # Redis trims whole nodes of entries (100 by default), so a few more than the bound may stay
    assert 10 <= redis_client.xlen(keys.turn_events("r-1")) < 250
    assert [e.data["n"] for e in kept] == list(range(1000 - len(kept), 1000))


def test_publishing_to_an_unreachable_server_logs_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    with RedisLiveEvents("redis://127.0.0.1:1/0") as live, caplog.at_level(logging.WARNING):
        live.publish(delta())
        with pytest.raises(StoreUnavailableError):
            live.read(EventScope.tree("r-1"))
    assert "publishing live event MODEL_DELTA of turn r-1" in caplog.text


def test_entries_that_are_not_events_are_skipped(redis_url: str, keys: RedisKeys, redis_client: Redis[Any]) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        redis_client.xadd(keys.turn_events("r-1"), {"something": "else"})
        redis_client.xadd(keys.turn_events("r-1"), {"event": "not json"})
        good = delta()
        live.publish(good)
        assert ids(live.read(EventScope.tree("r-1"))) == [good.event_id]


@pytest.mark.parametrize("arguments", [{"retention_s": 0}, {"maxlen": 0}, {}])
def test_bad_settings_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        options: dict[str, Any] = {"redis_url": "redis://127.0.0.1:6379/15"} if arguments else {}
        RedisLiveEvents(**options, **arguments)
