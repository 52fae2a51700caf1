"""A backlog of new turns does not hold back a turn under way, on both brokers; the worker warns about its capacity."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from kombu.connection import Connection

from agent_runner import AgentResumeCommand, AgentTurnStatus
from tests.integration.celery_workers.celery_cluster import RABBITMQ_URL, Cluster
from workers.app import is_first_step

pytestmark = pytest.mark.integration

BACKLOG = 20


def _broker_url(kind: str) -> str | None:
    if kind == "redis":
        return None  # the cluster's Redis
    url = os.environ.get("AGENT_RUNNER_TEST_AMQP_URL", RABBITMQ_URL)
    try:
        with Connection(url, connect_timeout=3) as connection:  # type: ignore[no-untyped-call]  # kombu is untyped
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.fail(f"RabbitMQ at {url} is unreachable ({type(exc).__name__}: {exc}); start it first")
    return url


def _model_answers(cluster: Cluster) -> dict[str, list[int]]:
    """Per turn, the log positions of its saved model answers (one worker thread: the order they were made)."""
    events = sa.table("agent_turn_events", sa.column("id"), sa.column("turn_id"), sa.column("type"))
    query = sa.select(events.c.turn_id, events.c.id).where(events.c.type == "MODEL_RESPONSE").order_by(events.c.id)
    answers: dict[str, list[int]] = {}
    with cluster.turn_store.engine.connect() as connection:
        for turn_id, position in connection.execute(query):
            answers.setdefault(str(turn_id), []).append(int(position))
    return answers


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_resumed_turn_finishes_before_most_of_a_backlog_of_new_turns_starts(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    # Given a turn that started and waits for an approval, with no worker running
    cluster = make_cluster(broker_url=_broker_url(broker))
    first = cluster.start_worker("w1", concurrency=1, pool="threads")
    waiting = cluster.runner.start("worker-agent", json.dumps({"kind": "approval", "label": "under-way"}))
    cluster.wait_for(
        lambda: cluster.load(waiting.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 30, "the approval"
    )
    first.stop()
    # And a backlog of new turns queued behind it
    backlog = [
        cluster.runner.start("worker-agent", json.dumps({"kind": "steps", "label": f"b{i}", "steps": 1})).id
        for i in range(BACKLOG)
    ]
    # When the waiting turn is approved, and a worker that takes one task at a time, one
    # step per task, starts on all of it
    call_id = cluster.load(waiting.id).pending_tool_calls[0].id
    cluster.runner.submit_resume(waiting.id, AgentResumeCommand.approve_tool(call_id))
    cluster.start_worker("w2", concurrency=1, pool="threads", env={"AGENT_RUNNER_STEPS_PER_TASK": "1"})
    everything = [waiting.id, *backlog]
    cluster.wait_for(
        lambda: all(cluster.load(turn_id).status is AgentTurnStatus.COMPLETED for turn_id in everything),
        90,
        "every turn to complete",
    )
    # Then the resumed turn (two more tasks: its approved call, then its answer) gave its
    # last answer before most of the backlog had its first one
    answers = _model_answers(cluster)
    finished = answers[waiting.id][-1]
    started_before = [turn_id for turn_id in backlog if answers[turn_id][0] < finished]
    assert len(started_before) <= 3, f"{len(started_before)} of {BACKLOG} new turns went first"


def test_only_the_first_step_of_a_turn_counts_as_new_work() -> None:
    assert is_first_step(("t-1", 0))
    assert is_first_step(["t-1", 0])
    assert not is_first_step(("t-1", 1))
    assert not is_first_step(("t-1", False))
    assert not is_first_step(("c-1",))
    assert not is_first_step(None)
