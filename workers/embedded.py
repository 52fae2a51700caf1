"""The embedded deployment: turns stepped in this process on the SQL store, with no Redis, broker or beat.

`agent-runner worker` and the HTTP server in its `embedded` (and `none`) worker mode build
it here, so both run the same pieces, started and stopped in the same order:

- an `AgentRunner` on the SQL store, instrumented, with `AGENT_RUNNER_SETUP` applied;
- an `InboxPump` that starts queued messages when their conversation frees;
- when stepping: an `AgentWorker` (SQL leases) that also runs the sweeps of
  `workers.sweeps.SWEEPS` an embedded process runs (approval and form deadlines, the webhooks
  of `AGENT_RUNNER_WEBHOOKS`) at the table's intervals, and the scheduler firing the turns of
  `AGENT_RUNNER_SCHEDULES` (each tick starts one turn, however many processes fire it).

In a Celery deployment beat and the Celery tasks do the sweeping and firing instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runner import AgentLoader, AgentRunner, InProcessModelLimiter
from agent_runner.worker import AgentWorker
from store import SqlTurnLease
from workers.agents import apply_runner_setup
from workers.database import Database
from workers.inbox import INBOX_SWEEP_INTERVAL_S, InboxPump
from workers.settings import WorkerSettings
from workers.sweeps import embedded_sweeps
from workers.telemetry import instrument
from workers.webhook_deliverer import WebhookDeliverer, build_deliverer

if TYPE_CHECKING:
    from workers.embedded_timers import Scheduler

logger = logging.getLogger("workers.embedded")

WORKER_STOP_TIMEOUT_S = 30.0
"""How long stopping waits for the steps in flight; a step still running then ends on its own (its lease expires)."""

SCHEDULER_STOP_TIMEOUT_S = 10.0
"""How long stopping waits for a scheduled tick being fired."""


@dataclass(frozen=True)
class Stepping:
    """How the embedded worker steps turns.

    Attributes:
        concurrency: Stepping threads: turns in flight at once.
        lease_ttl: Seconds a turn lease lasts without renewal (default: `AGENT_RUNNER_LEASE_TTL_S`).
        poll_interval: Seconds between polls when idle.
    """

    concurrency: int
    lease_ttl: float | None = None
    poll_interval: float = 0.2


@dataclass
class EmbeddedDeployment:
    """The pieces of an embedded deployment on one database; `start()` them, then `stop()` them.

    Stopping leaves the database open: whoever opened it closes it.

    Attributes:
        database: The database every piece works on.
        runner: Starts, resumes and cancels turns, and steps them in `worker`.
        pump: Starts queued inbox messages when their conversation frees.
        worker: Steps turns and runs the deadline and webhook sweeps; None when turns are stepped elsewhere.
        deliverer: Delivers the webhooks (a sweep of `worker`); None without webhooks or without a worker.
        scheduler: Fires the scheduled turns; None without schedules or without a worker.
    """

    database: Database
    runner: AgentRunner
    pump: InboxPump
    worker: AgentWorker | None = None
    deliverer: WebhookDeliverer | None = None
    scheduler: Scheduler | None = None

    def start(self) -> None:
        """Start stepping, delivering, pumping the inbox and firing schedules."""
        if self.worker is not None:
            self.worker.start()
        self.pump.start()
        if self.scheduler is not None:
            self.scheduler.start()

    def stop(self) -> None:
        """Stop in reverse: no tick starts a turn as the rest stops, and the steps in flight finish last."""
        if self.scheduler is not None and not self.scheduler.stop(timeout=SCHEDULER_STOP_TIMEOUT_S):
            logger.warning(
                "the scheduler was still firing a tick after %.0f s; stopping without it", SCHEDULER_STOP_TIMEOUT_S
            )
        self.pump.stop()
        if self.worker is not None and not self.worker.stop(timeout=WORKER_STOP_TIMEOUT_S):
            logger.warning(
                "the embedded worker still had steps in flight after %.0f s; their leases expire",
                WORKER_STOP_TIMEOUT_S,
            )


def embedded_runner(settings: WorkerSettings, database: Database, agent_loader: AgentLoader) -> AgentRunner:
    """A runner on the SQL backends of `database`, with the policy and `AGENT_RUNNER_SETUP` of `settings`.

    Raises:
        SettingsError: `AGENT_RUNNER_SETUP` cannot be applied.
    """
    # Without Redis the limits are kept in this process: one embedded process per deployment shares them.
    limiter = None
    if settings.model_limits:
        limiter = InProcessModelLimiter(settings.model_limits, tenant_weights=settings.model_tenant_weights)
    runner = AgentRunner(
        turn_store=database.turn_store,
        agent_loader=agent_loader,
        chat_memory_provider=database.memories,
        policy=settings.policy(),
        model_limiter=limiter,
    )
    return apply_runner_setup(runner, settings.runner_setup)


def build_embedded(
    settings: WorkerSettings,
    database: Database,
    agent_loader: AgentLoader,
    stepping: Stepping | None,
    *,
    service_name: str | None = None,
) -> EmbeddedDeployment:
    """Build the embedded deployment on `database` (see the module docstring); nothing runs before `start()`.

    Args:
        settings: The deployment's settings.
        database: The opened database (its owner closes it).
        agent_loader: The agents.
        stepping: How to step turns here; None when they are stepped elsewhere (the runner
            then only starts, resumes and cancels them, and the inbox pump runs alone).
        service_name: `service.name` of the spans, when tracing is configured here.

    Raises:
        SettingsError: `AGENT_RUNNER_SETUP` cannot be applied.
        ScheduleError: The schedules of `AGENT_RUNNER_SCHEDULES` cannot be loaded.
    """
    runner = embedded_runner(settings, database, agent_loader)
    # Spans, metrics and the log context of every step this process runs.
    instrument(runner, service_name=service_name)
    pump = InboxPump(runner, database.inbox, settings.inbox_agent, INBOX_SWEEP_INTERVAL_S)
    runner.add_event_listener(pump.on_event)
    deployment = EmbeddedDeployment(database=database, runner=runner, pump=pump)
    if stepping is None:
        return deployment
    # Imported here: the schedules read cron fields with Celery's parser.
    from workers.embedded_timers import build_scheduler

    if settings.schedules is not None:
        deployment.scheduler = build_scheduler(runner, database.inbox, settings.schedules, notify_inbox=pump.notify)
    deployment.deliverer = build_deliverer(settings.webhooks, database.engine)
    deployment.worker = AgentWorker(
        runner,
        lease=SqlTurnLease(database.engine),
        concurrency=stepping.concurrency,
        lease_ttl=settings.lease_ttl_s if stepping.lease_ttl is None else stepping.lease_ttl,
        poll_interval=stepping.poll_interval,
        # No beat here: the worker runs the sweep table's embedded sweeps.
        sweeps=embedded_sweeps(runner, settings, deployment.deliverer),
    )
    return deployment
