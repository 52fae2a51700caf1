"""`step_turn` deliveries against real worker processes: duplicates, stale versions, held leases, ETAs, budgets."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest

from agent_runner import Agent, AgentResumeCommand, AgentTurnStatus, AiMessage, ScriptedChatModel
from store import RedisTurnLease
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration


def _spec(kind: str, label: str, **extra: object) -> str:
    return json.dumps({"kind": kind, "label": label, **extra})


def _outcomes(cluster: Cluster) -> list[str]:
    return re.findall(r"agent_runner\.step_turn\[[^\]]+\] succeeded in [0-9.e-]+s: '([a-z-]+)'", cluster.logs())


def _settle(cluster: Cluster, deliveries: int, timeout: float = 20.0) -> None:
    """Wait until the workers finished `deliveries` step_turn deliveries (of any outcome)."""
    cluster.wait_for(lambda: len(_outcomes(cluster)) >= deliveries, timeout, f"{deliveries} step_turn deliveries")


def test_duplicate_and_stale_deliveries_change_nothing(cluster: Cluster) -> None:
    # Given an approval turn whose start message is delivered four times, before any worker runs
    turn = cluster.runner.start("worker-agent", _spec("approval", "dup"))
    for _ in range(3):
        cluster.wiring.dispatcher.send_step(turn.id, turn.version)
    cluster.start_worker("w1")

    # When the deliveries are processed
    cluster.wait_for(
        lambda: cluster.load(turn.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL, 20, "the approval suspension"
    )
    _settle(cluster, 4)
    waiting = cluster.load(turn.id)

    # Then the model was asked once and the three extra deliveries were no-ops (stale, or
    # refused by the lease when one arrived while the first was still stepping)
    assert waiting.model_iterations == 1
    outcomes = _outcomes(cluster)
    assert outcomes.count("stepped") == 1
    assert set(outcomes) <= {"stepped", "stale", "lease-held"}

    # Given a stale delivery of the old version and one for a waiting turn
    cluster.wiring.dispatcher.send_step(turn.id, 0)
    cluster.wiring.dispatcher.send_step(turn.id, waiting.version)
    _settle(cluster, 6)
    assert cluster.load(turn.id).version == waiting.version
    assert set(_outcomes(cluster)[4:]) <= {"not-runnable", "stale", "lease-held"}

    # When the approval is submitted and its step message is duplicated three times
    call_id = waiting.suspension.correlation_id if waiting.suspension else ""
    resumed = cluster.runner.submit_resume(turn.id, AgentResumeCommand.approve_tool(call_id or ""))
    for _ in range(3):
        cluster.wiring.dispatcher.send_step(turn.id, resumed.version)
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the turn to end")
    _settle(cluster, 10)

    # Then the approved tool ran exactly once and the model answered once more
    final = cluster.load(turn.id)
    assert final.status is AgentTurnStatus.COMPLETED
    assert final.model_iterations == 2
    ledger = cluster.ledger()
    assert [(row["effect"], row["executions"]) for row in ledger] == [("dup:approved", 1)]
    assert _outcomes(cluster).count("stepped") == 2


def test_delivery_while_another_worker_holds_the_lease_is_a_no_op(cluster: Cluster) -> None:
    # Given a READY turn whose lease another owner holds
    turn = cluster.runner.start("worker-agent", _spec("plain", "held"))
    with RedisTurnLease(cluster.redis_url, prefix=cluster.settings.redis_prefix) as lease:
        held = lease.acquire(turn.id, "someone-else", 60_000)
        assert held is not None

        # When a worker receives the turn's step
        cluster.start_worker("w1")
        _settle(cluster, 1)

        # Then it left the turn alone
        assert _outcomes(cluster) == ["lease-held"]
        assert cluster.load(turn.id).status is AgentTurnStatus.READY
        lease.release(held)

    # And once the lease is free, the next delivery runs it
    cluster.wiring.dispatcher.send_step(turn.id, turn.version)
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the turn to end")
    assert cluster.load(turn.id).status is AgentTurnStatus.COMPLETED


def test_eta_retry_fires_once_and_not_before_it_is_due(cluster: Cluster) -> None:
    # Given a tool that fails once and asks for 1.5 s before the retry (no beat is running)
    cluster.start_worker("w1")
    turn = cluster.runner.start("worker-agent", _spec("retry", "eta", failures=1, after=1.5))

    # When the turn is scheduled for a retry
    cluster.wait_for(
        lambda: cluster.load(turn.id).status is AgentTurnStatus.RETRY_SCHEDULED, 20, "the retry to be scheduled"
    )
    scheduled = cluster.load(turn.id)
    assert scheduled.next_retry_at is not None
    due = scheduled.next_retry_at.timestamp()

    # Then the ETA message runs it once, at or after the due time, and it completes
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the retried turn to end")
    time.sleep(1.0)  # room for a second, wrong firing to show up
    final = cluster.load(turn.id)
    assert final.status is AgentTurnStatus.COMPLETED
    [(tries, last_at)] = cluster.attempts().values()
    assert tries == 2
    assert last_at >= due - 0.05  # the clocks are the same machine's
    assert [(row["effect"], row["executions"]) for row in cluster.ledger()] == [("eta:flaky", 1)]


def test_a_task_reenqueues_exactly_one_follow_up_when_its_step_budget_runs_out(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given workers that take at most 2 steps per task, and a turn of 13 steps
    cluster = make_cluster(AGENT_RUNNER_STEPS_PER_TASK="2")
    cluster.start_worker("w1")
    turn = cluster.runner.start("worker-agent", _spec("steps", "budget", steps=6))

    # When it runs to the end
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 30, "the turn to end")
    final = cluster.load(turn.id)
    _settle(cluster, -(-final.steps // 2))

    # Then every task stepped, and none was a duplicate follow-up
    assert final.status is AgentTurnStatus.COMPLETED
    assert final.steps == 13
    outcomes = _outcomes(cluster)
    assert outcomes == ["stepped"] * 7, outcomes


def test_a_turn_the_workers_cannot_step_is_not_retried_in_a_hot_loop(cluster: Cluster) -> None:
    # Given a turn of an agent that only the web app knows (registered by passing the object)
    turn = cluster.runner.start(Agent(id="web-only", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    cluster.start_worker("w1")

    # When a worker receives it and cannot load the agent
    _settle(cluster, 1)
    time.sleep(1.0)

    # Then it logged the failure once, counted it in the turn (a poison turn ends after a few
    # such failures), and left the turn to the stale-turn sweep
    assert _outcomes(cluster) == ["stepped"]
    assert "AgentNotFound" in cluster.logs()
    counted = cluster.load(turn.id)
    assert (counted.version, counted.step_failures, counted.status) == (turn.version + 1, 1, AgentTurnStatus.READY)
