"""A non-idempotent tool call cut off: a Celery worker SIGKILLed at each point of it, or its body raising after it acted.

`create_ticket` is `@tool(idempotent=False)`: the runner saves the call's start before its
body runs. A worker is held at one point of the call (`tests.helpers.crash.pause_this_process_once`)
and killed there by the test: before the body, during it (the insert sent, not committed),
or after it (the ticket committed, the result not saved). Four turns are in the call at
once when the kill comes. Another worker (or a new pool process of the same worker) takes
them over once their leases expire and the stale-turn sweep sends them again:

- the turn whose tool has a reconcile function completes with exactly one ticket, the body
  run again only when the reconcile function found no ticket;
- the three others wait for a person with the outcome unknown, the body not run again, and
  each person's choice does exactly what it says: retry runs the body once more (a second
  ticket if the first one was made: the person took that risk), mark done makes no ticket
  and the model sees the result the person gave, fail makes no ticket and the model is told
  the call failed.

The same holds when no worker dies but the body raises `TimeoutError` after it created the
ticket (the retry policy calls that transient): the call's outcome is just as unknown, so
it is reconciled (the reconcile function asked once) or put to a person, never retried blindly.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent_runner import AgentResumeCommand, AgentTurn, AgentTurnStatus, ToolMessage
from tests.helpers.crash import CRASH_DIR_ENV, PAUSE_AT_ENV, paused_processes
from tests.integration.celery_workers.celery_cluster import Cluster
from tests.integration.celery_workers.chaos_agents import (
    AFTER,
    BEFORE,
    DURING,
    LOADER,
    SETUP,
    reconcile_calls,
    ticket_result,
)

pytestmark = pytest.mark.integration

RECONCILED = "reconciled"
RETRY, MARK_DONE, FAIL = "retry", "mark-done", "fail"
"""The choices of the person asked about a call whose outcome is unknown."""
GIVEN_RESULT = "ticket T-900 created by hand"
"""The result a person who marks the call done gives."""
FAIL_REASON = "no ticket is wanted after all"
TIMEOUT_S = 60.0


def _reconcile_calls(cluster: Cluster, idempotency_key: str) -> int:
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.connect() as connection:
            found = connection.execute(
                sa.text("SELECT attempts FROM chaos_calls WHERE idempotency_key = :key"),
                {"key": reconcile_calls(idempotency_key)},
            ).scalar()
            return int(found or 0)
    finally:
        engine.dispose()


def _tickets(cluster: Cluster, turn_id: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT * FROM chaos_tickets WHERE turn_id = :turn_id ORDER BY id"), {"turn_id": turn_id}
            )
            return [dict(row) for row in rows.mappings()]
    finally:
        engine.dispose()


def _tool_message(turn: AgentTurn) -> ToolMessage:
    [message] = [m for m in turn.messages if isinstance(m, ToolMessage)]
    return message


def _wait(cluster: Cluster, turn_id: str, predicate: Callable[[AgentTurn], bool], what: str) -> AgentTurn:
    cluster.wait_for(lambda: predicate(cluster.load(turn_id)), TIMEOUT_S, what)
    return cluster.load(turn_id)


def _outcome_unknown(turn: AgentTurn) -> bool:
    return (
        turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL
        and turn.suspension is not None
        and turn.suspension.is_outcome_unknown
    )


def _kill_at(cluster: Cluster, point: str, kill: str, crash_dir: Path) -> tuple[dict[str, AgentTurn], set[int]]:
    """Start the four turns, hold the worker at `point` of their calls, kill it, and let another take over.

    Returns the turns as they were saved when the kill came, by name, and the pids killed.
    """
    # A threads pool runs every call in the worker's own process; a prefork pool runs each
    # in a pool process, which is what gets killed then.
    pool = "threads" if kill == "worker" else "prefork"
    doomed = cluster.start_worker("doomed", pool=pool, concurrency=4, env={PAUSE_AT_ENV: point})
    turn_ids = {name: cluster.runner.start(agent, json.dumps({"label": name})).id for name, agent in _AGENTS.items()}
    cluster.wait_for(lambda: len(paused_processes(crash_dir)) == 4, TIMEOUT_S, f"four calls held {point}")
    paused = {key.removesuffix(f"@{point}"): pid for key, pid in paused_processes(crash_dir).items()}
    at_kill = {name: cluster.load(turn_id) for name, turn_id in turn_ids.items()}
    assert set(paused) == {call.id for turn in at_kill.values() for call in turn.pending_tool_calls}
    for name, turn in at_kill.items():
        # The start of each call was saved before its body could run, and nothing after it
        assert turn.status is AgentTurnStatus.RUNNING
        assert turn.started_call_ids == [call.id for call in turn.pending_tool_calls], name
        assert len(_tickets(cluster, turn.id)) == (1 if point == AFTER else 0), name

    if kill == "worker":
        assert set(paused.values()) == {doomed.pid}
        doomed.kill()
        cluster.start_worker("fresh", pool="threads", concurrency=4)
    else:
        assert doomed.pid not in paused.values() and len(set(paused.values())) == 4
        for pid in set(paused.values()):
            os.kill(pid, signal.SIGKILL)
    # The sweeps send the orphaned turns again once their leases have expired.
    cluster.start_beat()
    return at_kill, set(paused.values())


@pytest.mark.parametrize(
    ("point", "kill"),
    [
        (BEFORE, "worker"),
        (DURING, "worker"),
        (AFTER, "worker"),
        (AFTER, "pool-process"),
        pytest.param(BEFORE, "pool-process", marks=pytest.mark.slow),
        pytest.param(DURING, "pool-process", marks=pytest.mark.slow),
    ],
)
def test_a_worker_killed_inside_a_non_idempotent_call_never_repeats_it_unasked(
    point: str, kill: str, make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    # Given workers that may be held in ticket calls, and four turns held at `point` of
    # theirs when the worker running them is killed
    crash_dir = tmp_path / "crashes"
    crash_dir.mkdir()
    cluster = make_cluster(
        AGENT_RUNNER_AGENT_LOADER=LOADER, AGENT_RUNNER_SETUP=SETUP, **{CRASH_DIR_ENV: str(crash_dir)}
    )
    at_kill, killed = _kill_at(cluster, point, kill, crash_dir)
    made_before_kill = 1 if point == AFTER else 0

    # Then the turn with a reconcile function completes with exactly one ticket, whose
    # result the model sees whether the body ran again or the ticket was found; the three
    # others wait for a person, and each choice does exactly what it says
    calls = {name: turn.pending_tool_calls[0].id for name, turn in at_kill.items()}
    reconciled = _settle(cluster, {name: turn.id for name, turn in at_kill.items()}, calls, made_before_kill)
    [ticket] = _tickets(cluster, reconciled.id)
    assert (ticket["pid"] in killed) is (point == AFTER), "the body ran again although the ticket was made"


def test_a_non_idempotent_call_that_raised_after_acting_is_reconciled_or_put_to_a_person(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given a worker, and four ticket calls whose first execution creates the ticket and
    # then raises TimeoutError, which the retry policy calls transient
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER)
    cluster.start_worker("worker", pool="threads", concurrency=4)
    turn_ids = {
        name: cluster.runner.start(agent, json.dumps({"label": name, "fail_after_commit": True})).id
        for name, agent in _AGENTS.items()
    }

    # Then the call is never retried blindly: the reconcile function finds the ticket (asked
    # once), the others wait for a person with one ticket made, and each choice does what it says
    reconciled = _settle(cluster, turn_ids, None, made_before=1)
    [ticket] = _tickets(cluster, reconciled.id)
    assert _reconcile_calls(cluster, ticket["idempotency_key"]) == 1


_AGENTS = {
    RECONCILED: "reconciled-ticket-agent",
    RETRY: "ticket-agent",
    MARK_DONE: "ticket-agent",
    FAIL: "ticket-agent",
}
"""The agent of each of the four turns, by name."""


def _settle(
    cluster: Cluster, turn_ids: Mapping[str, str], calls: Mapping[str, str] | None, made_before: int
) -> AgentTurn:
    """Check the four turns through to their end, the person's choices included; return the reconciled one.

    Args:
        cluster: The cluster running them.
        turn_ids: The turns by name (`RECONCILED`, `RETRY`, `MARK_DONE`, `FAIL`).
        calls: The id of each turn's ticket call, when known beforehand.
        made_before: Tickets each call had made before its outcome became unknown (0 or 1).
    """
    reconciled = _wait(cluster, turn_ids[RECONCILED], lambda t: t.is_terminal, "the reconciled turn to end")
    assert reconciled.status is AgentTurnStatus.COMPLETED, reconciled.error
    tickets = _tickets(cluster, reconciled.id)
    assert len(tickets) == 1, f"the reconciled call made {len(tickets)} tickets"
    assert _tool_message(reconciled).content == ticket_result(tickets[0]["id"])
    assert reconciled.final_output == f"done:{RECONCILED}:{ticket_result(tickets[0]['id'])}"
    assert reconciled.started_call_ids == []

    # Each of the others waits for a person, its call not run again
    waiting = {
        choice: _wait(cluster, turn_ids[choice], _outcome_unknown, f"the {choice} turn to ask a person")
        for choice in (RETRY, MARK_DONE, FAIL)
    }
    for choice, turn in waiting.items():
        assert turn.suspension is not None and turn.suspension.correlation_id is not None
        if calls is not None:
            assert turn.suspension.correlation_id == calls[choice], choice
        made = _tickets(cluster, turn.id)
        assert len(made) == made_before, choice
        assert all(t["idempotency_key"] == f"{turn.id}:{turn.suspension.correlation_id}" for t in made), choice

    # When a person retries the first call, marks the second done and fails the third
    commands: dict[str, Callable[[str], AgentResumeCommand]] = {
        RETRY: AgentResumeCommand.approve_tool,
        MARK_DONE: lambda call_id: AgentResumeCommand.tool_result(call_id, GIVEN_RESULT),
        FAIL: lambda call_id: AgentResumeCommand.reject_tool(call_id, FAIL_REASON),
    }
    for choice, turn in waiting.items():
        assert turn.suspension is not None and turn.suspension.correlation_id is not None
        command = commands[choice](turn.suspension.correlation_id).with_metadata("approverId", "operator")
        cluster.runner.submit_resume(turn.id, command)
    done = {
        choice: _wait(cluster, turn.id, lambda t: t.is_terminal, f"the {choice} turn to end")
        for choice, turn in waiting.items()
    }
    assert {choice: turn.status for choice, turn in done.items()} == dict.fromkeys(done, AgentTurnStatus.COMPLETED)

    # Then retry ran the body exactly once more: one ticket in all, or a second one when the
    # first had been made (what the person chose), and the model sees the new ticket
    retried = _tickets(cluster, done[RETRY].id)
    assert len(retried) == made_before + 1
    assert _tool_message(done[RETRY]).content == ticket_result(retried[-1]["id"])
    # And mark done made no ticket; the model sees the result the person gave
    assert len(_tickets(cluster, done[MARK_DONE].id)) == made_before
    assert _tool_message(done[MARK_DONE]).content == GIVEN_RESULT
    assert done[MARK_DONE].final_output == f"done:{MARK_DONE}:{GIVEN_RESULT}"
    # And fail made no ticket; the model is told the call failed, and why
    assert len(_tickets(cluster, done[FAIL].id)) == made_before
    failed = _tool_message(done[FAIL])
    assert failed.is_error and FAIL_REASON in failed.content
    assert all(turn.started_call_ids == [] for turn in done.values())
    return reconciled
