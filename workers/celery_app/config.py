"""The Celery configuration of agent-runner, built from explicit settings; nothing here reads the environment at import.

`workers.celery_app.worker_app` builds the app of the `celery` command (`workers.app`) with these
functions; producers with settings of their own (`workers.build_runner(settings)`, the HTTP
server) build theirs here, so the environment of their process never leaks in. Beat's
schedule is made from the sweep table (`workers.sweeps.SWEEPS`) and the scheduled turns.

The choices that make turn execution safe:

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

from typing import Any

from celery import Celery
from kombu.entity import Exchange, Queue

from workers.celery_app.names import STEP_TURN, new_turns_queue
from workers.schedules import beat_entries, load_schedules
from workers.settings import WorkerSettings
from workers.sweeps import SWEEPS


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration for `settings`: safety settings, the sweeps and the scheduled turns in its beat schedule.

    Raises:
        ScheduleError: `AGENT_RUNNER_SCHEDULES` names schedules that cannot be loaded.
    """
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
        "beat_schedule": beat_schedule(settings),
    }


def beat_schedule(settings: WorkerSettings) -> dict[str, Any]:
    """Beat's schedule under `settings`: every sweep of `workers.sweeps.SWEEPS` that runs, then the scheduled turns.

    Raises:
        ScheduleError: `AGENT_RUNNER_SCHEDULES` names schedules that cannot be loaded.
    """
    entries: dict[str, Any] = {}
    for sweep in SWEEPS:
        interval = sweep.interval(settings)
        if interval is None:
            continue
        # A sweep that waited longer than one interval in the queue (workers down or busy)
        # is dropped: the next one does the same work, so they never pile up.
        options = {"queue": settings.queue, "expires": interval}
        entries[sweep.beat_entry] = {"task": sweep.task, "schedule": interval, "options": options}
    return {**entries, **beat_entries(load_schedules(settings.schedules), settings.queue)}


def task_queues(queue: str) -> tuple[Queue, Queue]:
    """The queues a worker consumes, in the order it prefers them: `queue`, then its queue of new turns."""
    exchange = Exchange(queue, type="direct")  # type: ignore[no-untyped-call]  # kombu is untyped
    new = new_turns_queue(queue)
    return (
        Queue(queue, exchange, routing_key=queue),  # type: ignore[no-untyped-call]
        Queue(new, exchange, routing_key=new),  # type: ignore[no-untyped-call]
    )


def is_first_step(args: Any) -> bool:
    """Whether `step_turn` arguments `(turn_id, version)` ask for a turn's first step (version 0, never saved since)."""
    return isinstance(args, list | tuple) and len(args) == 2 and type(args[1]) is int and args[1] == 0


class _SettingsCelery(Celery):  # type: ignore[misc]  # Celery is untyped
    """The Celery app of agent-runner: its broker is the one of its settings, and first steps go to the queue of new turns.

    Celery itself prefers `CELERY_BROKER_URL` (and `CELERY_BROKER_READ_URL`/`_WRITE_URL`)
    from the environment over its configuration, so an app built from explicit settings
    would publish to whatever broker the process's environment names. The version in a
    `step_turn` message tells a turn's first step (sent when the turn is saved READY) from
    the steps that continue it, so producers and the dispatcher keep naming one queue.
    """

    def __init__(self, broker_url: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings_broker_url = broker_url

    def connection_for_read(self, url: str | None = None, **kwargs: Any) -> Any:
        return super().connection_for_read(url or self.settings_broker_url, **kwargs)

    def connection_for_write(self, url: str | None = None, **kwargs: Any) -> Any:
        return super().connection_for_write(url or self.settings_broker_url, **kwargs)

    def connection(self, hostname: str | None = None, **kwargs: Any) -> Any:
        return super().connection(hostname or self.settings_broker_url, **kwargs)

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task named `name`; a first step sent to the default queue goes to its queue of new turns."""
        queue = self.conf.task_default_queue
        if name == STEP_TURN and options.get("queue", queue) == queue and is_first_step(args):
            options["queue"] = new_turns_queue(queue)
        return super().send_task(name, args, kwargs, **options)


def create_app(settings: WorkerSettings | None = None) -> Celery:
    """Build a Celery app that sends tasks, configured from `settings` (default: the environment, read now).

    With settings given, nothing comes from the environment, the broker included. A
    producer sends tasks by name and needs neither the task functions nor the agents; the
    app a worker runs registers them too (`workers.celery_app.worker_app.create_worker_app`).
    """
    # Imported here: the telemetry package loads the metrics and tracing modules, which a
    # module that only configures Celery should not pull in at import.
    from workers.telemetry.celery_signals import connect_publishing

    settings = settings if settings is not None else WorkerSettings.from_env()
    celery_app = _SettingsCelery(settings.broker_url, "agent_runner")
    celery_app.conf.update(celery_config(settings))
    connect_publishing()  # the enqueue time and the sender's trace on each message, in any sending process
    return celery_app
