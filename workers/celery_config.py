"""The Celery configuration of agent-runner, built from explicit settings; nothing here reads the environment at import.

`workers.app` builds the app of the `celery` command from the environment with these
functions; producers with settings of their own (`workers.build_runner(settings)`, the HTTP
server) build theirs here, so the environment of their process never leaks in.

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
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from workers.names import DELIVER_WEBHOOKS, SWEEP_DEADLINES, SWEEP_DUE_RETRIES, SWEEP_INBOX, SWEEP_STALE_TURNS
from workers.settings import WorkerSettings


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
            **_webhook_entries(settings),
        },
    }


def _webhook_entries(settings: WorkerSettings) -> dict[str, Any]:
    """The beat entry of the webhook deliveries, when webhooks are configured."""
    if settings.webhooks is None:
        return {}
    interval = settings.webhooks.interval_s
    # Like a sweep, a tick that waited longer than one interval is dropped: the next does its work.
    options = {"queue": settings.queue, "expires": interval}
    return {"agent-runner-deliver-webhooks": {"task": DELIVER_WEBHOOKS, "schedule": interval, "options": options}}


class _SettingsCelery(Celery):  # type: ignore[misc]  # Celery is untyped
    """A Celery app whose broker is the one of its settings.

    Celery itself prefers `CELERY_BROKER_URL` (and `CELERY_BROKER_READ_URL`/`_WRITE_URL`)
    from the environment over its configuration, so an app built from explicit settings
    would publish to whatever broker the process's environment names.
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


def create_app(settings: WorkerSettings | None = None) -> Celery:
    """Build a Celery app configured from `settings` (default: the environment).

    With settings given, nothing comes from the environment, the broker included. The
    worker imports the task modules (`include`) when it starts; a producer sends tasks by
    name and needs neither them nor the agents.
    """
    settings = settings if settings is not None else WorkerSettings.from_env()
    celery_app = _SettingsCelery(
        settings.broker_url, "agent_runner", include=["workers.tasks", "workers.beat", "workers.webhook_task"]
    )
    celery_app.conf.update(celery_config(settings))
    return celery_app
