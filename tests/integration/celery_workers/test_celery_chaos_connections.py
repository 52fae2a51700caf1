"""Approved tools whose own database connections are terminated in the middle of their calls, on real Celery workers.

Every turn of `change-agent` asks a person to approve a few changes, one at a time; each
approved change is applied by `apply_change` over a PostgreSQL connection of its own. A
thread of the test terminates those connections (`pg_terminate_backend`, found by their
application name) while calls are in them, at random moments, for the whole run. The retry
policy's defaults must take the cut connections for transient errors, so every turn still
completes, every approved change is applied once under its idempotency key, and no call
runs again once it has returned.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from agent_runner import AgentTurn, AgentTurnStatus, AiMessage, ToolCall
from tests.integration.celery_workers.celery_cluster import Cluster, ConnectionKiller
from tests.integration.celery_workers.chaos_agents import LOADER, TOOL_APPLICATION_VARIABLE

pytestmark = pytest.mark.integration


def _calls(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return _rows(cluster, "SELECT * FROM chaos_calls")


def _effects(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return _rows(cluster, "SELECT * FROM chaos_effects")


def _rows(cluster: Cluster, query: str) -> dict[str, dict[str, Any]]:
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.connect() as connection:
            return {row["idempotency_key"]: dict(row) for row in connection.execute(sa.text(query)).mappings()}
    finally:
        engine.dispose()


def run_under_connection_chaos(
    make_cluster: Callable[..., Cluster], admin: psycopg.Connection[Any], turns: int, changes: int, timeout: float
) -> None:
    """Run `turns` turns of `changes` approved changes each while the tool's connections are cut, and check them."""
    # Given two workers, and a thread that cuts the tool's connections whenever a call is in one
    application = f"chaos-tool-{uuid.uuid4().hex[:10]}"
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **{TOOL_APPLICATION_VARIABLE: application})
    cluster.start_worker("w1", wait=False)
    cluster.start_worker("w2", wait=False)
    for worker in cluster.processes:
        cluster.wait_ready(worker)
    killer = ConnectionKiller(admin, application, seed=turns * changes)
    killer.start()
    started = time.monotonic()

    # When the turns run, with a person approving every change as it comes up
    turn_ids = [
        cluster.runner.start("change-agent", json.dumps({"label": f"t{i}", "changes": changes})).id
        for i in range(turns)
    ]
    pending = list(turn_ids)

    def all_ended() -> bool:
        nonlocal pending
        pending = [turn_id for turn_id in pending if not cluster.load(turn_id).is_terminal]
        return not pending

    try:
        cluster.wait_for(all_ended, timeout, f"{turns} turns to end", tick=lambda: cluster.answer_people(pending))
    finally:
        killer.stop()
    elapsed = time.monotonic() - started
    assert killer.error is None, f"the connection killer died: {killer.error!r}"

    # Then every turn completed; none failed on a cut connection
    finals = [cluster.load(turn_id) for turn_id in turn_ids]
    statuses = Counter(turn.status for turn in finals)
    assert statuses == {AgentTurnStatus.COMPLETED: turns}, [(t.id, t.status, t.error) for t in finals if t.error]

    # And every approved change was applied, under the idempotency key of its one call
    approved: dict[str, ToolCall] = {
        f"{turn.id}:{call.id}": call for turn in finals for call in _tool_calls(turn) if call.name == "apply_change"
    }
    assert len(approved) == turns * changes
    effects = _effects(cluster)
    assert set(effects) == set(approved), "an approved change is missing, or a change was applied under another key"
    applied = Counter(row["change"] for row in effects.values())
    assert applied == Counter(call.arguments["change"] for call in approved.values())
    assert max(applied.values()) == 1, "a change was applied twice"

    # And no call ran again once it had returned; a call committed more than once only when
    # the connection was cut after its commit, before the answer came back (the effect
    # table's key absorbed the repeat)
    calls = _calls(cluster)
    assert set(calls) == set(approved)
    assert {key: row["returns"] for key, row in calls.items() if row["returns"] != 1} == {}
    unexplained = {key: row for key, row in calls.items() if row["commits"] - 1 > row["failures"]}
    assert unexplained == {}, "a call committed again without having lost its connection"

    # And the chaos was real: connections were cut in the middle of calls, and the calls retried
    failures = sum(row["failures"] for row in calls.values())
    retried = sum(1 for row in calls.values() if row["attempts"] > 1)
    lost_answers = sum(row["commits"] - 1 for row in calls.values())
    print(
        f"{turns * changes} approved changes in {elapsed:.1f}s: {killer.killed} connections cut mid-call, "
        f"{failures} failed attempts, {retried} calls retried, {lost_answers} commits whose answer was lost"
    )
    assert killer.killed > 0 and failures > 0 and retried > 0, "no call lost its connection: the test proved nothing"
    assert sum(row["attempts"] for row in calls.values()) == len(calls) + failures


def _tool_calls(turn: AgentTurn) -> list[ToolCall]:
    return [call for message in turn.messages if isinstance(message, AiMessage) for call in message.tool_calls]


def test_approved_tools_whose_connections_are_cut_mid_call_complete_every_change_once(
    make_cluster: Callable[..., Cluster], admin: psycopg.Connection[Any]
) -> None:
    run_under_connection_chaos(make_cluster, admin, turns=12, changes=4, timeout=90)


@pytest.mark.slow
def test_hundreds_of_approved_changes_whose_connections_are_cut_mid_call_are_each_made_once(
    make_cluster: Callable[..., Cluster], admin: psycopg.Connection[Any]
) -> None:
    run_under_connection_chaos(make_cluster, admin, turns=60, changes=5, timeout=600)
