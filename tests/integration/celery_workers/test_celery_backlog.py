"""A backlog of new turns does not hold back a turn under way, on both brokers; the worker warns about its capacity."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from agent_runner import AgentResumeCommand, AgentTurnStatus
from tests.helpers.metrics import free_port, scrape
from tests.integration.celery_workers.celery_cluster import Cluster, reachable_rabbitmq_url
from workers.celery_app.config import is_first_step

pytestmark = pytest.mark.integration

BACKLOG = 20


def _broker_url(kind: str) -> str | None:
    return None if kind == "redis" else reachable_rabbitmq_url()  # None: the cluster's Redis


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
    # last answer before most of the backlog had its first one: with Redis the worker asks
    # for turns under way first, so at most the message it held already goes first; RabbitMQ
    # hands out from both queues roughly in turn, where the follow-ups of the new turns
    # already started also wait
    answers = _model_answers(cluster)
    finished = answers[waiting.id][-1]
    started_before = [turn_id for turn_id in backlog if answers[turn_id][0] < finished]
    allowed = 3 if broker == "redis" else BACKLOG // 2 - 1
    assert len(started_before) <= allowed, f"{len(started_before)} of {BACKLOG} new turns went first"


def test_only_the_first_step_of_a_turn_counts_as_new_work() -> None:
    assert is_first_step(("t-1", 0))
    assert is_first_step(["t-1", 0])
    assert not is_first_step(("t-1", 1))
    assert not is_first_step(("t-1", False))
    assert not is_first_step(("c-1",))
    assert not is_first_step(None)


def test_a_worker_with_the_thread_pool_serves_its_metrics_and_a_prefork_worker_is_warned(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given a worker with the shipped pool, serving metrics
    cluster = make_cluster(AGENT_RUNNER_METRICS_ADDR="127.0.0.1")
    port = free_port()
    threads = cluster.start_worker(
        "threads", concurrency=1000, pool="threads", env={"AGENT_RUNNER_METRICS_PORT": str(port)}
    )
    # When it runs a turn of five steps
    turn = cluster.runner.start("worker-agent", json.dumps({"kind": "steps", "label": "metrics", "steps": 2}))
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.COMPLETED, 60, "the turn")
    # Then its metrics count the steps, and it logged no capacity warning
    steps = sum(value for (name, _), value in scrape(port).items() if name == "agent_runner_steps_total")
    assert steps == cluster.load(turn.id).steps == 5
    assert "turn(s) at once" not in threads.output()
    threads.stop()
    # And a prefork worker of two processes is told it holds two turns at once
    prefork = cluster.start_worker("prefork", concurrency=2)
    assert "the prefork pool with concurrency 2 holds 2 turn(s) at once" in prefork.output()
