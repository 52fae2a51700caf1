"""`workers.build_runner()` from the environment: start, submit_resume and cancel enqueue instead of running."""

from __future__ import annotations

import json

import pytest

import workers
from agent_runner import AgentResumeCommand, AgentRunner, AgentTurnStatus
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration


def test_a_runner_built_from_the_environment_enqueues_work_for_the_workers(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a web app whose environment points at the workers' services
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    runner = workers.build_runner()
    try:
        check_runner(cluster, runner)
    finally:
        runner.turn_store.engine.dispose()  # type: ignore[attr-defined]


def check_runner(cluster: Cluster, runner: AgentRunner) -> None:

    # When it starts turns while no worker runs, nothing runs in the calling thread
    plain = runner.start("worker-agent", json.dumps({"kind": "plain", "label": "web"}))
    approval = runner.start("worker-agent", json.dumps({"kind": "approval", "label": "web"}))
    assert runner.turn_store.load(plain.id).status is AgentTurnStatus.READY
    assert cluster.queue_length() == 2

    # Then the workers run them, a decision submitted from the web app continues the turn there
    cluster.start_worker("w1")
    cluster.wait_for(lambda: cluster.load(plain.id).status is AgentTurnStatus.COMPLETED, 20, "the plain turn")
    cluster.wait_for(
        lambda: cluster.load(approval.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval"
    )
    waiting = cluster.load(approval.id)
    call_id = waiting.suspension.correlation_id if waiting.suspension else ""
    resumed = runner.submit_resume(approval.id, AgentResumeCommand.approve_tool(call_id or ""))
    assert resumed.status is AgentTurnStatus.RUNNING
    cluster.wait_for(lambda: cluster.load(approval.id).status is AgentTurnStatus.COMPLETED, 20, "the approved turn")

    # And a waiting turn cancelled from the web app ends at once, with its history closed out
    another = runner.start("worker-agent", json.dumps({"kind": "approval", "label": "cancel"}))
    cluster.wait_for(
        lambda: cluster.load(another.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the second approval"
    )
    cancelled = runner.cancel(another.id)
    assert cancelled.status is AgentTurnStatus.CANCELLED
    assert cancelled.pending_tool_calls == []
    assert [row["effect"] for row in cluster.ledger()] == ["web:approved"]
