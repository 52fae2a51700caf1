"""A turn started with a delay, on real worker processes: run after its time, never before, by ETA or by the sweep."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from agent_runner import AgentEventType, AgentTurn, AgentTurnStatus
from agent_runner.ids import utcnow
from agent_runner.persistence import EventScope
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.sweeps import sweep_due_retries

pytestmark = pytest.mark.integration

FINISH_BOUND = timedelta(seconds=15)
"""How long after its start time a plain delayed turn must have completed (generous: a loaded machine)."""


def _spec(label: str) -> str:
    return json.dumps({"kind": "plain", "label": label})


def _outcomes(cluster: Cluster) -> list[str]:
    return re.findall(r"agent_runner\.step_turn\[[^\]]+\] succeeded in [0-9.e-]+s: '([a-z-]+)'", cluster.logs())


def _taken_at(cluster: Cluster, turn: AgentTurn) -> datetime:
    """When a worker took the turn off the queue (its one TURN_RUNNING event)."""
    events = cluster.turn_store.read_events(EventScope.tree(turn.id))
    [running] = [event for event in events if event.type is AgentEventType.TURN_RUNNING]
    return running.timestamp


def test_a_delayed_turn_runs_after_its_delay_and_an_early_delivery_is_a_no_op(cluster: Cluster) -> None:
    # Given a ready worker and a turn that may start 2 s from now
    cluster.start_worker("w1")
    not_before = utcnow() + timedelta(seconds=2)
    turn = cluster.runner.start("worker-agent", _spec("delayed"), not_before=not_before)
    assert (turn.status, turn.starts_at) == (AgentTurnStatus.READY, not_before)

    # When a step message arrives at once (a duplicate, or a clock ahead)
    cluster.wiring.dispatcher.send_step(turn.id, turn.version)
    cluster.wait_for(lambda: "not-due" in _outcomes(cluster), 20, "the early delivery")

    # Then it changed nothing: the turn still waits, READY, at the same version
    early = cluster.load(turn.id)
    assert (early.status, early.version, early.starts_at) == (AgentTurnStatus.READY, turn.version, not_before)
    assert "stepped" not in _outcomes(cluster)

    # And the turn runs once its time has come, once, and completes well within the bound
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the delayed turn to end")
    final = cluster.load(turn.id)
    assert (final.status, final.final_output) == (AgentTurnStatus.COMPLETED, "done:delayed")
    assert _taken_at(cluster, turn) >= not_before  # the clocks are the same machine's
    assert final.updated_at - not_before < FINISH_BOUND
    assert final.next_retry_at is None
    assert _outcomes(cluster).count("stepped") == 1


def test_a_delayed_start_beyond_the_eta_limit_is_sent_by_the_sweep_once_due(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given workers that send at most 0.5 s of ETA to the broker, and a turn that may start 2 s from now
    cluster = make_cluster(AGENT_RUNNER_MAX_ETA_S="0.5")
    cluster.start_worker("w1")
    not_before = utcnow() + timedelta(seconds=2)
    turn = cluster.runner.start("worker-agent", _spec("swept"), not_before=not_before)

    # When the due sweep runs before the start time, it sends nothing
    assert sweep_due_retries(cluster.wiring) == 0
    assert cluster.load(turn.id).status is AgentTurnStatus.READY

    # And the due sweep runs until it sends the turn, once its time has come
    cluster.wait_for(lambda: sweep_due_retries(cluster.wiring) == 1, 10, "the sweep to send the delayed start")
    assert utcnow() >= not_before

    # Then the turn completes, taken off the queue not before its time
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the delayed turn to end")
    final = cluster.load(turn.id)
    assert final.status is AgentTurnStatus.COMPLETED
    assert _taken_at(cluster, turn) >= not_before
    assert final.updated_at - not_before < FINISH_BOUND
