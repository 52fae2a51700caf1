"""The message outbox on real brokers: every message queued reaches the queue once, sent in batches and on close."""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import signals

from tests.integration.celery_workers.celery_cluster import Cluster, reachable_rabbitmq_url
from workers.celery_app.names import STEP_TURN
from workers.celery_app.outbox import MessageOutbox
from workers.wiring import build_wiring

pytestmark = pytest.mark.integration

SENDERS = 8
PER_SENDER = 60


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_cluster(request: pytest.FixtureRequest, make_cluster: Callable[..., Cluster]) -> Cluster:
    """A cluster without workers, its broker Redis or RabbitMQ."""
    if request.param == "rabbitmq":
        return make_cluster(broker_url=reachable_rabbitmq_url())
    return make_cluster()


@contextmanager
def slow_first_publish(seconds: float) -> Iterator[list[str]]:
    """Hold the first publish for `seconds` (messages queued meanwhile wait in the outbox); yields the senders' names."""
    names: list[str] = []

    def hold(sender: Any = None, **_: Any) -> None:
        names.append(str(sender))
        if len(names) == 1:
            time.sleep(seconds)

    signals.before_task_publish.connect(hold, weak=False)
    try:
        yield names
    finally:
        signals.before_task_publish.disconnect(hold)


def test_every_message_queued_from_many_threads_reaches_the_broker_once(broker_cluster: Cluster) -> None:
    # Given an outbox over the cluster's app, publishing at most 7 messages per batch
    outbox = MessageOutbox(broker_cluster.celery_app, max_batch=7)
    queue = broker_cluster.settings.queue
    expected = {(f"turn-{sender}-{n}", n % 2) for sender in range(SENDERS) for n in range(PER_SENDER)}

    # When 8 threads queue 60 step messages each (first steps and later ones), and it is closed
    def send(sender: int) -> None:
        for n in range(PER_SENDER):
            assert outbox.put(STEP_TURN, (f"turn-{sender}-{n}", n % 2), {"queue": queue})

    threads = [threading.Thread(target=send, args=(sender,)) for sender in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outbox.close()

    # Then each message is in the broker exactly once
    found = broker_cluster.queued_steps()
    assert set(found) == expected
    assert set(found.values()) == {1}


def test_closing_sends_what_is_still_queued_and_later_messages_go_out_at_once(broker_cluster: Cluster) -> None:
    outbox = MessageOutbox(broker_cluster.celery_app)
    queue = broker_cluster.settings.queue
    with slow_first_publish(0.5):
        # Given messages queued while the thread is held up by the first one
        for n in range(20):
            outbox.put(STEP_TURN, (f"turn-{n}", 1), {"queue": queue})
        # When the outbox is closed at once
        outbox.close()
    # Then every one of them was sent before `close` returned
    assert broker_cluster.queued_steps() == Counter({(f"turn-{n}", 1): 1 for n in range(20)})
    # And a message queued after closing is sent in the caller's thread
    assert outbox.put(STEP_TURN, ("late", 1), {"queue": queue})
    assert broker_cluster.queued_steps() == Counter({("late", 1): 1})


def test_each_message_is_published_in_the_context_of_its_sender(make_cluster: Callable[..., Cluster]) -> None:
    # The trace a message carries (stamped in `before_task_publish`) must be the sender's span.
    cluster = make_cluster()
    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")
    seen: dict[str, str] = {}

    def record(body: Any = None, **_: Any) -> None:
        seen[body[0][0]] = request.get()

    signals.before_task_publish.connect(record, weak=False)
    outbox = MessageOutbox(cluster.celery_app)
    try:

        def send(name: str) -> None:
            request.set(name)
            outbox.put(STEP_TURN, (name, 1), {"queue": cluster.settings.queue})

        threads = [threading.Thread(target=send, args=(f"r{n}",)) for n in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outbox.close()
    finally:
        signals.before_task_publish.disconnect(record)
    assert seen == {f"r{n}": f"r{n}" for n in range(10)}


def test_a_wiring_that_dispatches_in_the_background_sends_every_start_before_it_closes(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster()
    wiring = build_wiring(
        cluster.settings,
        cluster.celery_app,
        agent_loader=cluster.runner.agent_loader,
        background_dispatch=True,
    )
    with slow_first_publish(0.5):
        try:
            # Given turns started through it, their messages held up behind the first one
            turns = [wiring.runner.start("worker-agent", f"hello {n}") for n in range(10)]
        finally:
            # When it closes right after
            wiring.close()
    # Then every turn's first step is in the queue, once
    assert cluster.queued_steps() == Counter({(turn.id, 0): 1 for turn in turns})
