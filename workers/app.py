"""The Celery app of agent-runner: `celery -A workers.app worker` and `celery -A workers.app beat`.

Configured from the environment at import (see `workers.settings`). The choices that make
turn execution safe:

- JSON only: a task carries a turn id and a version, never a payload, so nothing needs
  pickle, and a broker message can never execute code on a worker.
- `task_acks_late` with `task_reject_on_worker_lost`: a message is acknowledged after its
  task returns, so a worker that dies mid-step leaves the message to be delivered again
  (RabbitMQ at once; Redis after the visibility timeout). The turn lease and the sweeps
  recover the turn earlier; the redelivery is then a harmless duplicate.
- Prefetch 1: a worker holds no more than the message it runs, so a long model call does
  not strand queued turns behind it.
- No result backend: the turn store holds every outcome.
- Two queues: the first step of a turn (`step_turn(turn_id, 0)`) goes to the queue of new
  turns, every later step (follow-ups, resumes, retries) and every other task to the
  configured queue, which workers take from first. A turn under way is then never sent
  behind a backlog of turns that have not started, so its latency stays close to its own
  service time. On Redis the worker asks the configured queue first on every fetch;
  RabbitMQ delivers from both queues roughly in turn, so turns under way get about half of
  the worker's slots whatever the backlog. Child turns start at version 0 too, and count as new.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from kombu.entity import Exchange, Queue

from workers.names import (
    STEP_TURN,
    SWEEP_DEADLINES,
    SWEEP_DUE_RETRIES,
    SWEEP_INBOX,
    SWEEP_STALE_TURNS,
    new_turns_queue,
)
from workers.settings import SettingsError, WorkerSettings
from workers.telemetry import celery_signals as telemetry_signals  # telemetry hook

logger = logging.getLogger("workers")


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration for `settings`: safety settings, the sweeps and the scheduled turns in its beat schedule.

    Raises:
        ScheduleError: `AGENT_RUNNER_SCHEDULES` names schedules that cannot be loaded.
    """
    from workers.schedules import beat_entries, load_schedules

    transport_options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.broker_url.startswith(("redis://", "rediss://", "redis+socket://")):
        # Without a socket timeout a publish can wait forever on a connection the network
        # silently dropped; the sweeps would then stall with it.
        transport_options["socket_timeout"] = 30
        if settings.broker_key_prefix:
            transport_options["global_keyprefix"] = settings.broker_key_prefix
        # Ask the queues in the order of `task_queues` on every fetch (the default rotates
        # them): turns under way before new ones.
        transport_options["queue_order_strategy"] = "priority"
    sweep_options = {
        "queue": settings.queue,
        # A sweep that waited longer than one interval in the queue (workers down or busy)
        # is dropped: the next one does the same work, so they never pile up.
        "expires": settings.sweep_interval_s,
    }
    return {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": transport_options,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A connection loss makes the broker redeliver the unacknowledged messages anyway,
        # so the tasks still running would only race their own redelivery.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_soft_time_limit": settings.soft_time_limit_s,
        "task_time_limit": settings.time_limit_s,
        "task_queues": task_queues(settings.queue),
        "task_default_queue": settings.queue,
        "task_default_exchange": settings.queue,
        "task_default_routing_key": settings.queue,
        "timezone": "UTC",
        "enable_utc": True,
        "beat_schedule": {
            "agent-runner-sweep-inbox": {
                "task": SWEEP_INBOX,
                "schedule": settings.sweep_interval_s,
                "options": sweep_options,
            },
            "agent-runner-sweep-stale-turns": {
                "task": SWEEP_STALE_TURNS,
                "schedule": settings.sweep_interval_s,
                "options": sweep_options,
            },
            "agent-runner-sweep-due-retries": {
                "task": SWEEP_DUE_RETRIES,
                "schedule": settings.sweep_interval_s,
                "options": sweep_options,
            },
            "agent-runner-sweep-deadlines": {
                "task": SWEEP_DEADLINES,
                "schedule": settings.deadline_sweep_interval_s,
                "options": {**sweep_options, "expires": settings.deadline_sweep_interval_s},
            },
            **beat_entries(load_schedules(settings.schedules), settings.queue),
        },
    }


def task_queues(queue: str) -> tuple[Queue, Queue]:
    """The queues a worker consumes, in the order it prefers them: `queue`, then its queue of new turns."""
    exchange = Exchange(queue, type="direct")  # type: ignore[no-untyped-call]  # kombu is untyped
    new = new_turns_queue(queue)
    return (
        Queue(queue, exchange, routing_key=queue),  # type: ignore[no-untyped-call]
        Queue(new, exchange, routing_key=new),  # type: ignore[no-untyped-call]
    )


class AgentRunnerCelery(Celery):  # type: ignore[misc]  # Celery is untyped
    """A Celery app that sends the first step of each turn to the queue of new turns.

    The version in the message tells a turn's first step (`step_turn(turn_id, 0)`, sent
    when the turn is saved READY) from the steps that continue it, so producers and the
    dispatcher keep naming one queue.
    """

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task named `name`; a first step sent to the default queue goes to its queue of new turns."""
        queue = self.conf.task_default_queue
        if name == STEP_TURN and options.get("queue", queue) == queue and is_first_step(args):
            options["queue"] = new_turns_queue(queue)
        return super().send_task(name, args, kwargs, **options)


def is_first_step(args: Any) -> bool:
    """Whether `step_turn` arguments `(turn_id, version)` ask for a turn's first step (version 0, never saved since)."""
    return isinstance(args, list | tuple) and len(args) == 2 and type(args[1]) is int and args[1] == 0


def create_app(settings: WorkerSettings | None = None) -> Celery:
    """Build a Celery app configured from `settings` (default: the environment).

    The worker imports the task modules (`include`) when it starts; a producer sends tasks
    by name and needs neither them nor the agents.
    """
    settings = settings if settings is not None else WorkerSettings.from_env()
    celery_app = AgentRunnerCelery("agent_runner", include=["workers.tasks", "workers.beat"])
    celery_app.conf.update(celery_config(settings))
    return celery_app


settings = WorkerSettings.from_env()
"""The settings this process's app was configured from (read once, at import)."""

app = create_app(settings)
"""The app the `celery` command loads with `-A workers.app`."""


def _check_agents(sender: Any = None, **_: Any) -> None:
    """Refuse to start a worker that could not run any turn, rather than fail every task later.

    It checks the agents, the runner set-up and the database: its schema must be at the
    revision this code needs (`agent-runner db upgrade` otherwise).
    """
    if getattr(sender, "app", None) is not app:
        return  # a worker of another Celery app in a process that imported this one
    from agent_runner import StoreError
    from workers.agents import load_agent_loader, load_runner_setup
    from workers.database import check_database

    try:
        if settings.agent_loader is None:
            raise SettingsError("AGENT_RUNNER_AGENT_LOADER", None, "a worker needs agents (module:attribute)")
        load_agent_loader(settings.agent_loader)
        load_runner_setup(settings.runner_setup)
        check_database(settings.database_url)
    except (SettingsError, StoreError) as exc:
        logger.critical("%s", exc)
        # SystemExit passes through Celery's signal dispatch, which logs and swallows Exceptions.
        raise SystemExit(f"agent-runner worker not started: {exc}") from exc


_tasks_per_process = 1


def tasks_per_worker_process() -> int:
    """Tasks each process of the worker started in this process runs at once (1 outside a worker)."""
    return _tasks_per_process


def _check_capacity(sender: Any = None, **_: Any) -> None:
    """Record how many tasks a process of this worker runs at once, and warn about what limits it."""
    global _tasks_per_process
    if getattr(sender, "app", None) is not app:
        return
    from workers.capacity import capacity_warnings, pool_name, tasks_per_process

    pool = pool_name(getattr(sender, "pool_cls", "prefork"))
    concurrency = int(getattr(sender, "concurrency", 1) or 1)
    _tasks_per_process = tasks_per_process(pool, concurrency)
    for warning in capacity_warnings(settings, pool, concurrency):
        logger.warning("%s", warning)


def _close_wiring(**_: Any) -> None:
    """Close this process's database pool and Redis connections on the way out."""
    from workers import wiring

    wiring.close_current()


# Telemetry hook: traces, metrics and log format of the worker processes (workers/telemetry).
# Connected before the handlers below, so that the metrics directory exists before anything else runs.
telemetry_signals.install(app, settings)

# Connected by call rather than as decorators: Celery is untyped, and a decorator would
# hide the handlers' signatures from the type checker.
signals.worker_init.connect(_check_agents, weak=False)
signals.worker_init.connect(_check_capacity, weak=False)
signals.worker_process_shutdown.connect(_close_wiring, weak=False)
