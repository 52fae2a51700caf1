"""`BackgroundPublisher`: live events sent from a thread of their own, in order, several per round trip."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from redis import Redis

from agent_runner import AgentEvent, AgentEventType
from agent_runner.persistence import EventScope
from store.batching import BatchingThread
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
        assert [e.data["n"] for e in live.read(EventScope.tree("r-1"), limit=1000)] == list(range(200))
        assert [e.data["n"] for e in live.read(EventScope.conversation("c-1"), limit=1000)] == list(range(200))
        assert [e.data["n"] for e in live.read(EventScope.tree("r-2"), limit=1000)] == list(range(200))
        publisher.close()


def test_close_sends_what_is_queued_and_later_events_are_ignored(redis_url: str, keys: RedisKeys) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        publisher = BackgroundPublisher(live)
        for n in range(50):
            publisher(event(n))
        publisher.close()
        publisher(event(99))
        assert [e.data["n"] for e in live.read(EventScope.tree("r-1"), limit=1000)] == list(range(50))


def test_publish_many_appends_a_batch_in_order_to_every_scope(redis_url: str, keys: RedisKeys) -> None:
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live:
        batch = [event(n, "r-1" if n % 2 else "r-2") for n in range(10)]
        live.publish_many(batch)
        live.publish_many([])
        assert [e.data["n"] for e in live.read(EventScope.conversation("c-1"))] == list(range(10))
        assert [e.data["n"] for e in live.read(EventScope.tree("r-1"))] == [1, 3, 5, 7, 9]
        assert [e.data["n"] for e in live.read(EventScope.tree("r-2"))] == [0, 2, 4, 6, 8]


def test_an_entry_redis_refuses_is_logged_and_the_rest_of_the_batch_goes_out(
    redis_url: str, keys: RedisKeys, redis_client: Redis[Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a key of another type under the name of one tree's stream
    redis_client.set(keys.turn_events("r-bad"), "not a stream")
    with RedisLiveEvents(redis_url, prefix=keys.prefix) as live, caplog.at_level(logging.WARNING):
        # When a batch of more events than one script call takes holds one event of that tree
        batch = [event(n, "r-bad" if n == 300 else "r-1", None) for n in range(1200)]
        live.publish_many(batch)
        # Then every other event reached its stream, in order, and the one lost is counted
        assert [e.data["n"] for e in live.read(EventScope.tree("r-1"), limit=2000)] == [
            n for n in range(1200) if n != 300
        ]
    assert "1 of them are lost" in caplog.text
    assert "WRONGTYPE" in caplog.text


class Recorder(BatchingThread[int]):
    """Records each batch it is handed, with the time it was."""

    def __init__(self, pause_s: float) -> None:
        super().__init__("recorder", max_pending=100, pause_s=pause_s)
        self.batches: list[tuple[float, list[int]]] = []

    def offer(self, item: int) -> None:
        assert self._offer(item)

    def _send_batch(self, batch: list[int]) -> None:
        self.batches.append((time.monotonic(), batch))


def test_batches_start_a_pause_apart_and_an_item_after_a_quiet_spell_goes_out_at_once() -> None:
    recorder = Recorder(pause_s=1.0)
    # Given an item sent at once, since nothing was sent before it
    offered = time.monotonic()
    recorder.offer(0)
    assert recorder.flush(10)
    # When more items come right after it
    for n in range(1, 6):
        recorder.offer(n)
    assert recorder.flush(10)
    # Then they wait for the pause and leave together
    (first_at, first), (second_at, second) = recorder.batches
    assert (first, second) == ([0], [1, 2, 3, 4, 5])
    assert first_at - offered < 0.5
    assert second_at - first_at >= 1.0
    # And an item that comes once the pause has passed is not held back
    time.sleep(1.0)
    offered = time.monotonic()
    recorder.offer(6)
    assert recorder.flush(10)
    assert recorder.batches[-1][1] == [6]
    assert recorder.batches[-1][0] - offered < 0.5
    recorder.close()


def test_a_negative_pause_is_refused() -> None:
    with pytest.raises(ValueError):
        Recorder(pause_s=-0.1)


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
