"""One sweep table: beat's schedule, the Celery tasks, the metric labels and the embedded worker's sweeps all come from it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner import AgentRunner, InMemoryAgentLoader, InMemoryAgentTurnStore
from agent_runner.periodic import SweepThread
from store.webhooks import WebhookDeliveryLog
from workers.app import app
from workers.celery_app.beat import SWEEP_ENTRIES
from workers.celery_app.config import celery_config
from workers.celery_app.names import DISPATCH_INBOX, RUN_SCHEDULE, STEP_TURN, SWEEP_LABELS
from workers.database import Database, open_database
from workers.embedded import Stepping, build_embedded
from workers.settings import WorkerSettings
from workers.sweeps import SWEEPS, Sweep, embedded_sweeps
from workers.telemetry.celery_signals import SWEEP_TASKS
from workers.webhook_deliverer import WebhookDeliverer

WITH_WEBHOOKS = {
    "AGENT_RUNNER_WEBHOOKS": "ended=https://hooks.example/ended",
    "AGENT_RUNNER_WEBHOOK_SECRET": "s3cret",
    "AGENT_RUNNER_WEBHOOK_INTERVAL_S": "3",
    "AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S": "5",
    "AGENT_RUNNER_ADMISSION_WINDOW": "4",
}


def test_the_table_names_each_sweep_and_task_once() -> None:
    names = [sweep.name for sweep in SWEEPS]
    tasks = [sweep.task for sweep in SWEEPS]
    assert len(set(names)) == len(names) and len(set(tasks)) == len(tasks)
    assert set(names) == {"inbox", "stale_turns", "due_retries", "deadlines", "admission", "webhooks"}
    # Registered task names travel in queued messages: they never change.
    assert set(tasks) == {
        "agent_runner.sweep_inbox",
        "agent_runner.sweep_stale_turns",
        "agent_runner.sweep_due_retries",
        "agent_runner.sweep_deadlines",
        "agent_runner.sweep_admission",
        "agent_runner.deliver_webhooks",
    }


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda sweep: sweep.name)
def test_the_setting_of_each_sweep_sets_its_interval(sweep: Sweep) -> None:
    settings = WorkerSettings.from_env({**WITH_WEBHOOKS, sweep.setting: "7"})
    assert sweep.interval(settings) == 7.0


def test_beat_schedules_every_sweep_of_the_table_that_runs_under_the_settings() -> None:
    schedule = celery_config(WorkerSettings.from_env(WITH_WEBHOOKS))["beat_schedule"]
    assert {entry["task"] for entry in schedule.values()} == {sweep.task for sweep in SWEEPS}
    assert set(schedule) == {sweep.beat_entry for sweep in SWEEPS}
    # The beat entries keep their names, so a persisted beat schedule keeps its last runs
    assert {"agent-runner-sweep-inbox", "agent-runner-deliver-webhooks"} <= set(schedule)
    intervals = {entry["task"]: entry["schedule"] for entry in schedule.values()}
    assert intervals["agent_runner.deliver_webhooks"] == 3.0
    assert intervals["agent_runner.sweep_deadlines"] == 5.0
    assert intervals["agent_runner.sweep_inbox"] == 10.0

    # Without webhooks (or admission) their sweep does not run, and beat does not send it
    plain = celery_config(WorkerSettings.from_env({}))["beat_schedule"]
    assert {entry["task"] for entry in plain.values()} == {
        sweep.task for sweep in SWEEPS if sweep.name not in ("webhooks", "admission")
    }


def test_the_worker_app_registers_a_task_for_every_sweep_of_the_table_and_no_other() -> None:
    registered = {name for name in app.tasks if name.startswith("agent_runner.")}
    assert registered - {STEP_TURN, DISPATCH_INBOX, RUN_SCHEDULE} == {sweep.task for sweep in SWEEPS}
    assert set(SWEEP_ENTRIES) == {sweep.name for sweep in SWEEPS}


def test_the_metrics_label_the_counted_sweeps_of_the_table() -> None:
    assert SWEEP_TASKS == {sweep.task: sweep.name for sweep in SWEEPS if sweep.counted}
    assert (
        set(SWEEP_TASKS.values()) == SWEEP_LABELS == {"inbox", "stale_turns", "due_retries", "deadlines", "admission"}
    )
    assert SWEEP_LABELS <= {sweep.name for sweep in SWEEPS}  # each label names a sweep of the table


def test_the_embedded_worker_runs_the_sweeps_of_the_table_that_have_an_embedded_run() -> None:
    runner = AgentRunner(turn_store=InMemoryAgentTurnStore())
    timers = SweepThread(embedded_sweeps(runner, WorkerSettings.from_env(WITH_WEBHOOKS), None))
    assert set(timers.intervals) == {sweep.name for sweep in SWEEPS if sweep.embedded is not None}
    assert timers.intervals == {"deadlines": 5.0, "webhooks": 3.0}
    # Without webhooks their sweep is off, as beat's entry is
    assert set(SweepThread(embedded_sweeps(runner, WorkerSettings.from_env({}), None)).intervals) == {"deadlines"}


EMBEDDED_OTHERWISE = {
    "inbox": "the InboxPump settles stuck claims and starts queued messages on a timer of its own",
    "stale_turns": "the AgentWorker's poll lists the RUNNING and READY turns whose lease is free",
    "due_retries": "the AgentWorker's poll lists the due retries and delayed starts",
    "admission": "an embedded process admits new turns at once: it has no admission window",
}
"""The sweeps an embedded process does not run from the table, and what does their job there."""


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = open_database(f"sqlite:///{tmp_path / 'sweeps.db'}")
    yield opened
    opened.close()


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda sweep: sweep.name)
def test_every_sweep_of_the_table_runs_in_both_modes(sweep: Sweep, database: Database) -> None:
    settings = WorkerSettings.from_env({**WITH_WEBHOOKS, "AGENT_RUNNER_DATABASE_URL": str(database.engine.url)})
    interval = sweep.interval(settings)
    # Celery: beat sends the sweep's task at the table's interval, and the worker app runs it
    entry = celery_config(settings)["beat_schedule"][sweep.beat_entry]
    assert (entry["task"], entry["schedule"]) == (sweep.task, interval)
    assert sweep.task in app.tasks
    # Embedded: the deployment's worker runs it at the same interval, or the process does its job otherwise
    deployment = build_embedded(settings, database, InMemoryAgentLoader([]), Stepping(1))
    assert deployment.worker is not None
    timers = deployment.worker.sweeps
    if sweep.embedded is None:
        assert sweep.name in EMBEDDED_OTHERWISE and sweep.name not in timers.sweeps
        return
    assert sweep.name not in EMBEDDED_OTHERWISE
    assert timers.intervals[sweep.name] == interval
    assert timers.sweeps[sweep.name].run() == 0  # it runs against the deployment's store: nothing is due


class CountingDeliverer(WebhookDeliverer):
    """A deliverer whose rounds only count themselves."""

    def __init__(self) -> None:
        settings = WorkerSettings.from_env(WITH_WEBHOOKS).webhooks
        assert settings is not None
        super().__init__(settings, WebhookDeliveryLog("sqlite://"))
        self.rounds = 0

    def run_once(self, limit: int = 20) -> int:
        self.rounds += 1
        return 0


class CountingRunner(AgentRunner):
    """A runner whose deadline sweeps count themselves; the second one fails as a store that went away."""

    def __init__(self) -> None:
        super().__init__(turn_store=InMemoryAgentTurnStore())
        self.sweeps = 0

    def apply_due_deadlines(self, limit: int = 100) -> int:
        self.sweeps += 1
        if self.sweeps == 2:
            raise RuntimeError("the store went away")
        return 1


def test_each_embedded_sweep_runs_at_start_then_once_per_interval_and_outlives_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    runner, deliverer = CountingRunner(), CountingDeliverer()
    timers = SweepThread(
        embedded_sweeps(runner, WorkerSettings.from_env(WITH_WEBHOOKS), deliverer), clock=lambda: now[0]
    )

    ran = [timers.run_due()]
    for moment in (102.0, 103.0, 105.0, 106.0, 110.0):
        now[0] = moment
        ran.append(timers.run_due())

    # At start both; then webhooks every 3 s and deadlines every 5 s; the failed deadline sweep is logged
    assert ran == [
        {"deadlines": 1, "webhooks": 0},
        {},
        {"webhooks": 0},
        {},
        {"webhooks": 0},
        {"deadlines": 1, "webhooks": 0},
    ]
    assert (runner.sweeps, deliverer.rounds) == (3, 4)
    assert any("the deadlines sweep failed" in record.getMessage() for record in caplog.records)


def test_the_embedded_sweeps_thread_starts_and_stops() -> None:
    runner = CountingRunner()
    timers = SweepThread(
        embedded_sweeps(runner, WorkerSettings.from_env({"AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S": "0.1"}), None)
    )
    timers.start()
    deadline = time.monotonic() + 5.0
    while runner.sweeps < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert timers.stop(timeout=5.0)
    assert runner.sweeps >= 3
