"""A database connection that the server drops under a `step_turn` delivery: one warning line, and the next recovers.

PostgreSQL ends a connection with `AdminShutdown` when an operator (or a failover)
terminates its backend. The pool drops the dead connection and the follow-up delivery
runs on a new one, so the drop is expected: it is logged once, at WARNING, with no
traceback.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from agent_runner import Agent, AgentTurnStatus, AiMessage, ChatRequest, InMemoryAgentLoader, ScriptedChatModel
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.celery_app import tasks
from workers.celery_app.tasks import StepOutcome
from workers.wiring import build_wiring

pytestmark = pytest.mark.integration


def terminate_backends(admin: psycopg.Connection[Any], application: str) -> int:
    """Terminate every backend of `application` and wait until they are gone; how many there were."""
    pids = [
        int(row[0])
        for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()", [application]
        ).fetchall()
    ]
    for pid in pids:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone() is not None:
        assert time.monotonic() < deadline, f"the backends {pids} never ended"
        time.sleep(0.01)
    return len(pids)


def test_a_connection_dropped_mid_step_logs_one_warning_and_the_next_delivery_recovers(
    make_cluster: Callable[..., Cluster],
    schema_url: str,
    admin: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a worker's wiring whose database connections carry an application name, and an
    # agent whose first model call is the moment the server terminates them
    application = f"dropped-{uuid.uuid4().hex[:10]}"
    url = sa.make_url(schema_url).update_query_dict({"application_name": application})
    cluster = make_cluster(AGENT_RUNNER_DATABASE_URL=url.render_as_string(hide_password=False))
    terminated: list[int] = []

    def reply(request: ChatRequest) -> AiMessage:
        if not terminated:
            terminated.append(terminate_backends(admin, application))
        return AiMessage(content="done")

    agent = Agent(id="steady", chat_model=ScriptedChatModel(reply))
    wiring = build_wiring(cluster.settings, cluster.celery_app, agent_loader=InMemoryAgentLoader([agent]))
    try:
        turn = wiring.runner.start("steady", "hello")
        with caplog.at_level(logging.DEBUG):
            # When a delivery steps the turn and its connections are dropped mid-step
            first = tasks.deliver_step_turn(wiring, turn.id, turn.version)
            assert terminated and terminated[0] > 0, "no connection was terminated: the test proved nothing"
            after_drop = wiring.turn_store.get_ref(turn.id)
            # Then the turn is as last saved, still runnable
            assert first is StepOutcome.STEPPED
            assert after_drop.status in (AgentTurnStatus.READY, AgentTurnStatus.RUNNING)
            # And the next delivery (the follow-up the task sent) runs on a new connection
            second = tasks.deliver_step_turn(wiring, after_drop.turn_id, after_drop.version)
        assert second is StepOutcome.STEPPED
        finished = wiring.turn_store.load(turn.id)
        assert finished.status is AgentTurnStatus.COMPLETED and finished.final_output == "done"
        assert finished.step_failures == 0
        # And the drop was logged once, as a warning naming it, without a traceback
        noted = [record for record in caplog.records if record.levelno >= logging.WARNING]
        assert [record.levelno for record in noted] == [logging.WARNING], [r.getMessage() for r in noted]
        message = noted[0].getMessage()
        assert turn.id in message and "AdminShutdown" in message, message
        assert [record.getMessage() for record in caplog.records if record.exc_info] == []
        assert "Traceback" not in caplog.text
    finally:
        wiring.close()
