"""Forged broker messages against real worker processes on PostgreSQL and Redis.

Anyone who can write to the broker can send a task message. A message whose arguments
do not fit its task is dropped with one warning line (no traceback), is never retried,
and changes no row and no lease or guard key; the worker goes on serving real turns.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
import sqlalchemy as sa
from redis import Redis

from agent_runner import AgentResumeCommand, AgentTurnStatus
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.celery_app.names import DISPATCH_INBOX, STEP_TURN, SWEEP_DUE_RETRIES, SWEEP_INBOX, SWEEP_STALE_TURNS

pytestmark = pytest.mark.integration

SQL_INJECTION = "x'; DROP TABLE agent_turns; --"


def state_digest(cluster: Cluster) -> str:
    """A hash of every row of every table in the test's schema and of its lease and guard keys."""
    hasher = hashlib.sha256()
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        tables = sa.MetaData()
        tables.reflect(engine)
        with engine.connect() as connection:
            for name in sorted(tables.tables):
                rows = sorted(repr(tuple(row)) for row in connection.execute(sa.select(tables.tables[name])))
                hasher.update(f"{name}:{rows}".encode())
    finally:
        engine.dispose()
    client: Redis[bytes] = Redis.from_url(cluster.redis_url, socket_timeout=5)
    try:
        prefix = cluster.settings.redis_prefix
        broker = cluster.settings.broker_key_prefix or "\x00"
        for key in sorted(client.scan_iter(f"{prefix}*")):
            if not key.decode().startswith(broker):  # the broker's own queues change with every message
                hasher.update(key + b"=" + (client.dump(key) or b""))
    finally:
        client.close()
    return hasher.hexdigest()


def _full_logs(cluster: Cluster) -> str:
    return "\n".join(process.output() for process in cluster.processes)


def _rejections(cluster: Cluster) -> list[str]:
    return re.findall(r"^.*rejected a agent_runner\.[a-z_]+ message: .*$", _full_logs(cluster), re.MULTILINE)


def test_forged_messages_are_dropped_with_one_line_and_change_nothing(cluster: Cluster) -> None:
    # Given a worker and a turn waiting for approval
    cluster.start_worker("w1")
    turn = cluster.runner.start("worker-agent", json.dumps({"kind": "approval", "label": "forged"}))
    cluster.wait_for(
        lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval suspension"
    )
    waiting = cluster.load(turn.id)
    before = state_digest(cluster)

    # When messages with the wrong arguments arrive for every task
    forged: list[tuple[str, list[Any], dict[str, Any]]] = [
        (STEP_TURN, [], {}),
        (STEP_TURN, [turn.id], {}),
        (STEP_TURN, [turn.id, waiting.version, "extra"], {}),
        (STEP_TURN, [turn.id, str(waiting.version)], {}),
        (STEP_TURN, [turn.id, None], {}),
        (STEP_TURN, [turn.id, True], {}),
        (STEP_TURN, [turn.id, 1.5], {}),
        (STEP_TURN, [[turn.id], waiting.version], {}),
        (STEP_TURN, [{"id": turn.id}, waiting.version], {}),
        (STEP_TURN, [12345, waiting.version], {}),
        (STEP_TURN, ["", waiting.version], {}),
        (STEP_TURN, ["t" * 200_000, waiting.version], {}),
        (STEP_TURN, ["t\x00", waiting.version], {}),
        (STEP_TURN, [SQL_INJECTION, waiting.version], {}),
        (STEP_TURN, [turn.id], {"version": waiting.version, "priority": 9}),
        (DISPATCH_INBOX, [], {}),
        (DISPATCH_INBOX, [None], {}),
        (DISPATCH_INBOX, ["c-1", "acme", "c-2"], {}),
        (DISPATCH_INBOX, ["c-1", SQL_INJECTION], {}),
        (DISPATCH_INBOX, ["c-1", 7], {}),
        (DISPATCH_INBOX, [SQL_INJECTION], {}),
        (SWEEP_INBOX, [1], {}),
        (SWEEP_STALE_TURNS, [], {"now": "x"}),
        (SWEEP_DUE_RETRIES, ["x"], {}),
    ]
    for name, args, kwargs in forged:
        cluster.celery_app.send_task(name, args=args, kwargs=kwargs, queue=cluster.settings.queue)

    # Then each is dropped with exactly one warning line, without a traceback or a retry
    cluster.wait_for(lambda: len(_rejections(cluster)) >= len(forged), 30, f"{len(forged)} rejections")
    logs = _full_logs(cluster)
    assert len(_rejections(cluster)) == len(forged)
    assert "Traceback" not in logs and "TypeError" not in logs
    assert "Retry in" not in logs and " raised unexpected" not in logs
    assert all(len(line) < 600 for line in _rejections(cluster))  # the forged values are not echoed
    # And no row, lease or guard key changed
    assert state_digest(cluster) == before

    # And the worker still serves real work: the approval goes through to the end
    call_id = waiting.suspension.correlation_id if waiting.suspension else None
    assert call_id is not None
    cluster.runner.submit_resume(turn.id, AgentResumeCommand.approve_tool(call_id))
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the turn to end")
    assert cluster.load(turn.id).status is AgentTurnStatus.COMPLETED
    assert [(row["effect"], row["executions"]) for row in cluster.ledger()] == [("forged:approved", 1)]
