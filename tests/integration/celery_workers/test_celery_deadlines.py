"""An approval deadline that expires under a running beat: the default applies once, recorded as the deadline's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from agent_runner import ActionStatus, AgentActionMessage, AgentEventType, AgentTurnStatus
from agent_runner.persistence import EventScope
from tests.helpers.celery_fleet import WorkerProcess
from tests.helpers.processes import REPO_ROOT
from tests.integration.celery_workers import ops_agents
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration


def _sweep(cluster: Cluster) -> None:
    """This process sweeps deadlines too: a second sweeper racing beat's."""
    cluster.runner.apply_due_deadlines()


def _sweeping(cluster: Cluster, *beats: WorkerProcess) -> None:
    """Wait until every beat sends deadline sweeps (beat takes a few seconds to start)."""
    cluster.wait_for(
        lambda: all("Sending due task agent-runner-sweep-deadlines" in beat.output() for beat in beats),
        45,
        "beat to send deadline sweeps",
    )


def test_an_expired_approval_is_approved_by_default_once_and_the_card_says_so(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given workers, a beat sweeping deadlines twice a second, and an agent whose approval
    # waits 3 s and is approved by default
    cluster = make_cluster(
        AGENT_RUNNER_AGENT_LOADER=f"{ops_agents.__name__}:build_loader",
        AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S="0.5",
    )
    cluster.start_worker("w1")
    _sweeping(cluster, cluster.start_beat())
    conversation = "conv-deadline"
    turn = cluster.runner.start("deadline-agent", "close-incident", conversation_id=conversation)
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 30, "the approval")
    waiting = cluster.load(turn.id)
    assert waiting.suspension is not None and waiting.suspension.deadline is not None
    assert (
        waiting.suspension.deadline - waiting.suspension.created_at
    ).total_seconds() == ops_agents.APPROVAL_TIMEOUT_S

    # When nobody decides, while this process sweeps the deadlines too (a second sweeper)
    cluster.wait_for(
        lambda: cluster.load(turn.id).is_terminal,
        30,
        "the deadline to approve the call and the turn to end",
        tick=lambda: _sweep(cluster),
    )

    # Then the call ran once, approved by the deadline, and the turn finished
    ended = cluster.load(turn.id)
    assert ended.status is AgentTurnStatus.COMPLETED
    assert [(row["effect"], row["executions"]) for row in cluster.ledger()] == [("close-incident", 1)]
    events = cluster.turn_store.read_events(EventScope.tree(turn.id), limit=1000)
    resumes = [e for e in events if e.type is AgentEventType.TURN_RESUMED]
    assert [(e.data["command"], e.data["metadata"].get("decided_by")) for e in resumes] == [("DEADLINE", "system")]
    assert len([e for e in events if e.type is AgentEventType.DEADLINE_APPROACHING]) <= 1

    # And the approval card in the conversation shows the deadline decided it
    (action,) = ended.page_actions
    memories = cluster.runner.chat_memory_provider
    assert memories is not None
    card = memories(conversation).get(action.message_id)
    assert isinstance(card, AgentActionMessage)
    assert (card.status, card.decided_by, card.reason) == (ActionStatus.APPROVED, "system", "deadline passed")
    assert card.decided_at is not None and card.decided_at >= waiting.suspension.deadline

    # And so does the command line
    shown = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--json", "turns", "show", turn.id],
        env=cluster.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    (decision,) = json.loads(shown.stdout)["decisions"]
    assert (decision["status"], decision["decided_by"], decision["reason"]) == ("APPROVED", "system", "deadline passed")


def test_the_reminder_goes_out_once_before_the_deadline(make_cluster: Callable[..., Cluster]) -> None:
    # Given a waiting approval and a beat sweeping deadlines often, reminding at 80 % of the wait
    cluster = make_cluster(
        AGENT_RUNNER_AGENT_LOADER=f"{ops_agents.__name__}:build_loader",
        AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S="0.2",
    )
    cluster.start_worker("w1")
    _sweeping(cluster, cluster.start_beat("beat-a"), cluster.start_beat("beat-b"))
    turn = cluster.runner.start("deadline-agent", "reminded", conversation_id="conv-reminder")
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 30, "the approval")

    # When the reminder time passes, then one DEADLINE_APPROACHING is stored before the deadline's decision
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 30, "the turn to end")
    types = [e.type for e in cluster.turn_store.read_events(EventScope.tree(turn.id), limit=1000)]
    assert types.count(AgentEventType.DEADLINE_APPROACHING) == 1
    assert types.index(AgentEventType.DEADLINE_APPROACHING) < types.index(AgentEventType.TURN_RESUMED)
    assert types.count(AgentEventType.TURN_RESUMED) == 1
    assert [(row["effect"], row["executions"]) for row in cluster.ledger()] == [("reminded", 1)]
