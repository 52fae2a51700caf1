"""The dispatcher under fair admission, against a real Redis and a recording broker: what is sent, and when."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis import Redis

from agent_runner import AgentEvent, AgentEventType, AgentTurn, AgentTurnStatus
from store.keys import RedisKeys
from store.redis_admission import RedisAdmission
from workers.celery_app.admission import TurnAdmission
from workers.celery_app.dispatch import CeleryDispatcher
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class RecordingApp:
    """Stands in for a Celery app: records what would have been published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def send_task(self, name: str, args: tuple[Any, ...], **options: Any) -> None:
        self.sent.append((name, args, options))


def dispatcher(app: RecordingApp) -> CeleryDispatcher:
    return CeleryDispatcher(app, WorkerSettings.from_env({"AGENT_RUNNER_QUEUE": "q"}), clock=lambda: NOW)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"agent-runner-test-{uuid.uuid4().hex}"
    yield prefix
    client: Redis[Any] = Redis.from_url(redis_url)
    found = list(client.scan_iter(match=RedisKeys(prefix).pattern(), count=1000))
    if found:
        client.delete(*found)
    client.close()


def new_turn(turn_id: str, tenant: str | None, version: int = 0) -> AgentTurn:
    return AgentTurn(
        id=turn_id,
        agent_id="a",
        root_turn_id=turn_id,
        status=AgentTurnStatus.READY,
        version=version,
        tenant_id=tenant,
        created_at=NOW,
        updated_at=NOW,
    )


def admitted_dispatcher(app: RecordingApp, redis_url: str, prefix: str, window: int = 2) -> Any:
    sender = dispatcher(app)
    admission = RedisAdmission("q", redis_url, prefix=prefix, window=window)
    sender.admission = TurnAdmission(admission, sender.send_step)
    return sender


def sent_turns(app: RecordingApp) -> list[tuple[str, int]]:
    return [(args[0], args[1]) for _, args, _ in app.sent]


def test_new_turns_wait_for_the_window_and_continuations_do_not(redis_url: str, prefix: str) -> None:
    # Given admission with a window of 2
    app = RecordingApp()
    sender = admitted_dispatcher(app, redis_url, prefix)
    # When four new turns and a continuation are dispatched
    for i in range(4):
        sender.dispatch(new_turn(f"n{i}", "acme"))
    sender.dispatch(new_turn("under-way", "acme", version=3))
    # Then two new turns were sent, and the continuation at once
    assert sent_turns(app) == [("n0", 0), ("n1", 0), ("under-way", 3)]
    sender.admission.close()


def test_a_turn_that_waits_says_its_place_in_a_live_event(redis_url: str, prefix: str) -> None:
    # Given admission with a window of 2 whose events are collected
    app = RecordingApp()
    sender = admitted_dispatcher(app, redis_url, prefix)
    announced: list[AgentEvent] = []
    sender.admission.announce = announced.append
    # When three turns of acme are dispatched
    for i in range(3):
        sender.dispatch(new_turn(f"n{i}", "acme"))
    # Then only the third waits, and says it is first in acme's line of one
    assert [(e.type, e.turn_id) for e in announced] == [(AgentEventType.TURN_QUEUED, "n2")]
    assert announced[0].data == {"status": "READY", "version": 0, "place": 1, "tenant_waiting": 1}
    assert not announced[0].type.is_durable
    sender.admission.close()


def test_a_started_or_ended_turn_lets_the_next_one_in(redis_url: str, prefix: str) -> None:
    # Given two admitted turns and two waiting
    app = RecordingApp()
    sender = admitted_dispatcher(app, redis_url, prefix)
    for i in range(4):
        sender.dispatch(new_turn(f"n{i}", "acme"))
    # When a worker starts the first, and the second is cancelled before it starts
    sender.admission.start("n0", "acme")
    sender.admission(AgentEvent(type=AgentEventType.TURN_CANCELLED, turn_id="n1"))
    # Then the waiting two were sent in their order
    assert sent_turns(app)[2:] == [("n2", 0), ("n3", 0)]
    sender.admission.close()


def test_a_turn_is_sent_at_once_when_the_admission_cannot_be_reached(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given admission on a Redis nobody listens to
    app = RecordingApp()
    sender = admitted_dispatcher(app, "redis://127.0.0.1:1/0", "agent-runner-test-unreachable")
    # When a new turn is dispatched
    with caplog.at_level(logging.WARNING, logger="workers"):
        sender.dispatch(new_turn("n0", "acme"))
    # Then it is sent anyway, with a warning
    assert sent_turns(app) == [("n0", 0)]
    assert any("sending it at once" in record.getMessage() for record in caplog.records)
    sender.admission.close()
