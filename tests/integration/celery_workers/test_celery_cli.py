"""`agent-runner resume` and `cancel` on a Celery deployment go through the workers' wiring.

No beat runs in these tests, so no sweep can move a turn: a turn resumed from the command
line advances only because the command enqueued its step, and the conversation's Redis
mark is free only because the cancel released it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from agent_runner import AgentTurnStatus
from agent_runner.persistence import ConversationKey
from store import InboxStatus
from tests.helpers.processes import REPO_ROOT
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.inbox import enqueue_message

pytestmark = pytest.mark.integration


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "--json", *args],
        env=cluster.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _spec(kind: str, label: str) -> str:
    return json.dumps({"kind": kind, "label": label})


def test_a_turn_resumed_from_the_command_line_is_enqueued_for_the_workers_at_once(cluster: Cluster) -> None:
    # Given a turn a worker ran until it waits for an approval (no beat: no sweep runs)
    cluster.start_worker("w1")
    turn = cluster.runner.start("worker-agent", _spec("approval", "cli"), conversation_id="conv-cli")
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval")
    call_id = cluster.load(turn.id).suspension.correlation_id  # type: ignore[union-attr]
    assert call_id is not None

    # When an operator approves it from the command line
    started = time.monotonic()
    result = _cli(cluster, "resume", turn.id, "--approve", call_id)

    # Then the command saved the decision and enqueued the step: a worker finishes the turn
    returned = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "RUNNING"
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the resumed turn to end")
    print(
        f"the command took {returned - started:.2f}s; the turn ended {time.monotonic() - returned:.2f}s after it returned"
    )
    ended = cluster.load(turn.id)
    assert ended.status is AgentTurnStatus.COMPLETED
    assert [(row["effect"], row["executions"]) for row in cluster.ledger()] == [("cli:approved", 1)]
    (action,) = ended.page_actions
    assert action.decision["decided_by"] and action.decision["decided_by"] != "system"


def test_a_cancel_from_the_command_line_frees_the_conversation_in_redis(cluster: Cluster) -> None:
    # Given a conversation turn waiting for an approval, marked active in the Redis guard,
    # and a message queued behind it
    cluster.start_worker("w1")
    conversation = "conv-cancel"
    turn = cluster.runner.start("worker-agent", _spec("approval", "cancelled"), conversation_id=conversation)
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval")
    assert cluster.wiring.guard.holder(ConversationKey(conversation)) == turn.id
    queued = enqueue_message(cluster.runner, conversation, "after the cancel", message_id="queued-1")
    assert queued.status is InboxStatus.PENDING

    # When an operator cancels it from the command line
    result = _cli(cluster, "cancel", turn.id, "--reason", "wrong customer")

    # Then the turn is closed out, the Redis mark is released, and the queued message starts
    assert result.returncode == 0, result.stderr
    cancelled = cluster.load(turn.id)
    assert cancelled.status is AgentTurnStatus.CANCELLED and "wrong customer" in (cancelled.error or "")
    cluster.wait_for(
        lambda: cluster.wiring.inbox.get("queued-1").status is InboxStatus.COMPLETED,  # type: ignore[union-attr]
        20,
        "the queued message to start",
    )
    following = cluster.wiring.inbox.get("queued-1")
    assert following is not None and following.turn_id is not None
    assert cluster.wiring.guard.holder(ConversationKey(conversation)) in (following.turn_id, None)
    cluster.wait_for(lambda: cluster.load(following.turn_id or "").is_terminal, 20, "the queued message's turn")
    assert cluster.wiring.guard.holder(ConversationKey(conversation)) is None


def test_the_mark_of_a_cancelled_turn_is_gone_even_when_nothing_follows(cluster: Cluster) -> None:
    conversation = "conv-alone"
    turn = cluster.runner.start("worker-agent", _spec("approval", "alone"), conversation_id=conversation)
    assert cluster.wiring.guard.holder(ConversationKey(conversation)) == turn.id

    result = _cli(cluster, "cancel", turn.id)

    assert result.returncode == 0, result.stderr
    assert cluster.load(turn.id).status is AgentTurnStatus.CANCELLED
    assert cluster.wiring.guard.holder(ConversationKey(conversation)) is None
