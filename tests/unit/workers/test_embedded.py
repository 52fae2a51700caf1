"""The embedded deployment: the pieces `agent-runner worker` and the HTTP server's embedded mode both run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner import AgentRunner, InMemoryAgentLoader
from workers.database import Database, open_database
from workers.embedded import Stepping, build_embedded
from workers.settings import WorkerSettings
from workers.telemetry.middleware import TelemetryMiddleware

SET_UP: list[AgentRunner] = []


def remember(runner: AgentRunner) -> None:
    """An `AGENT_RUNNER_SETUP` function: records the runners it was applied to."""
    SET_UP.append(runner)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = open_database(f"sqlite:///{tmp_path / 'embedded.db'}")
    yield opened
    opened.close()


@pytest.fixture
def settings(tmp_path: Path, database: Database) -> WorkerSettings:
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([{"name": "tick", "agent_id": "ops", "input": "check", "every": 3600}]))
    return WorkerSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": str(database.engine.url),
            "AGENT_RUNNER_SCHEDULES": str(schedules),
            "AGENT_RUNNER_WEBHOOKS": "ended=https://hooks.example/x",
            "AGENT_RUNNER_WEBHOOK_SECRET": "s",
            "AGENT_RUNNER_LEASE_TTL_S": "7",
            "AGENT_RUNNER_SETUP": f"{__name__}:remember",
        }
    )


def test_a_stepping_deployment_runs_the_worker_the_sweeps_and_the_scheduler(
    settings: WorkerSettings, database: Database
) -> None:
    SET_UP.clear()
    deployment = build_embedded(settings, database, InMemoryAgentLoader([]), Stepping(3, poll_interval=0.05))
    runner = deployment.runner
    assert SET_UP == [runner]
    assert any(isinstance(item, TelemetryMiddleware) for item in runner.middleware)
    assert deployment.worker is not None and deployment.worker.runner is runner
    assert (deployment.worker.concurrency, deployment.worker.poll_interval) == (3, 0.05)
    assert deployment.worker.lease_ttl_ms == 7000  # AGENT_RUNNER_LEASE_TTL_S
    # The worker runs the deadline and webhook sweeps of the table, at the intervals of the settings
    assert deployment.deliverer is not None
    worker, sweeps = deployment.worker, deployment.worker.sweeps
    assert sweeps.intervals == {
        "deadlines": settings.deadline_sweep_interval_s,
        "webhooks": settings.webhooks.interval_s if settings.webhooks else None,
    }
    assert worker.deadline_interval == settings.deadline_sweep_interval_s
    assert deployment.scheduler is not None and [s.name for s in deployment.scheduler.schedules] == ["tick"]
    deployment.start()
    try:
        started = worker.is_running and sweeps.is_running
    finally:
        deployment.stop()
    assert started and not worker.is_running and not sweeps.is_running
    database.turn_store.list_turns(limit=1)  # stopping leaves the database to its owner


def test_a_lease_given_for_the_worker_wins_over_the_setting(settings: WorkerSettings, database: Database) -> None:
    deployment = build_embedded(settings, database, InMemoryAgentLoader([]), Stepping(1, lease_ttl=2.0))
    assert deployment.worker is not None and deployment.worker.lease_ttl_ms == 2000


def test_without_stepping_only_the_runner_and_the_inbox_pump_run_here(
    settings: WorkerSettings, database: Database
) -> None:
    SET_UP.clear()
    deployment = build_embedded(settings, database, InMemoryAgentLoader([]), None)
    assert SET_UP == [deployment.runner]
    assert (deployment.worker, deployment.deliverer, deployment.scheduler) == (None, None, None)
    deployment.start()
    deployment.stop()
