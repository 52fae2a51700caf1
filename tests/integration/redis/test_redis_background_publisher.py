"""`BackgroundPublisher`: live events sent from a thread of their own, in order, several per round trip."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from agent_runner import AgentEvent, AgentEventType
from store.keys import RedisKeys
from store.redis_events import BackgroundPublisher, RedisLiveEvents

pytestmark = pytest.mark.integration


def event(n: int, root: str = "r-1", conversation: str | None = "c-1") -> AgentEvent:
    return AgentEvent(
        type=AgentEventType.MODEL_DELTA, turn_id=root, root_turn_id=root, conversation_id=conversation, data={"n": n}
    )


def test_queued_events_reach_their_streams_in_order(redis_url: str, keys: RedisKeys) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        publisher = BackgroundPublisher(live)
        # Given events of two trees queued from two threads, each thread's in its own order
        first = [event(n) for n in range(200)]
        second = [event(n, "r-2", None) for n in range(200)]

        def queue(batch: list[AgentEvent]) -> None:
            for item in batch:
                publisher(item)

        threads = [threading.Thread(target=queue, args=(batch,)) for batch in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # When the publisher has sent what was queued
        assert publisher.flush(10)
        # Then each scope holds its events exactly once, in the order they were queued
        assert [e.data["n"] for e in live.read(root_turn_id="r-1", limit=1000)] == list(range(200))
        assert [e.data["n"] for e in live.read(conversation_id="c-1", limit=1000)] == list(range(200))
        assert [e.data["n"] for e in live.read(root_turn_id="r-2", limit=1000)] == list(range(200))
        publisher.close()


def test_close_sends_what_is_queued_and_later_events_are_ignored(redis_url: str, keys: RedisKeys) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        publisher = BackgroundPublisher(live)
        for n in range(50):
            publisher(event(n))
        publisher.close()
        publisher(event(99))
        assert [e.data["n"] for e in live.read(root_turn_id="r-1", limit=1000)] == list(range(50))


def test_publish_many_appends_a_batch_in_order_to_every_scope(redis_url: str, keys: RedisKeys) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        batch = [event(n, "r-1" if n % 2 else "r-2") for n in range(10)]
        live.publish_many(batch)
        live.publish_many([])
        assert [e.data["n"] for e in live.read(conversation_id="c-1")] == list(range(10))
        assert [e.data["n"] for e in live.read(root_turn_id="r-1")] == [1, 3, 5, 7, 9]
        assert [e.data["n"] for e in live.read(root_turn_id="r-2")] == [0, 2, 4, 6, 8]


def test_events_beyond_the_bound_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    sending, release = threading.Event(), threading.Event()
    sent: list[int] = []

    class Stalled(RedisLiveEvents):
        def publish_many(self, events: Any) -> None:
            sending.set()
            release.wait(10)
            sent.extend(e.data["n"] for e in events)

    live = Stalled("redis://127.0.0.1:1/0")
    publisher = BackgroundPublisher(live, max_pending=3)
    with caplog.at_level(logging.WARNING):
        # Given a publisher whose thread is stuck sending the first event
        publisher(event(0))
        assert sending.wait(10)
        # When five more come, with room for three
        for n in range(1, 6):
            publisher(event(n))
    # Then two were dropped, with a warning, and the rest go out once Redis answers
    assert "live events pile up faster than Redis takes them; 1 dropped" in caplog.text
    release.set()
    assert publisher.flush(10)
    publisher.close()
    live.close()
    assert sent == [0, 1, 2, 3]


def test_an_unreachable_server_is_logged_and_the_publisher_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with RedisLiveEvents("redis://127.0.0.1:1/0") as live, caplog.at_level(logging.WARNING):
        publisher = BackgroundPublisher(live)
        publisher(event(0))
        assert publisher.flush(30)
        publisher(event(1))
        assert publisher.flush(30)
        publisher.close()
    assert "publishing live event MODEL_DELTA of turn r-1" in caplog.text


def test_a_bound_below_one_is_refused(redis_url: str) -> None:
    with RedisLiveEvents(redis_url) as live, pytest.raises(ValueError):
        BackgroundPublisher(live, max_pending=0)
