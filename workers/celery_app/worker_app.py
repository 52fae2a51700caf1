"""The app a `celery worker` or `celery beat` runs: the sending app of `create_app`, with its tasks and hooks."""

from __future__ import annotations

from celery import Celery

from workers.celery_app.beat import register_beat_tasks
from workers.celery_app.config import create_app
from workers.celery_app.process import install_process_hooks
from workers.celery_app.tasks import register_turn_tasks
from workers.settings import WorkerSettings
from workers.telemetry import celery_signals


def create_worker_app(settings: WorkerSettings | None = None) -> Celery:
    """Build the app a worker and beat run, configured from `settings` (default: the environment, read now).

    Its tasks are registered on it (the turn tasks, and one task per sweep of
    `workers.sweeps.SWEEPS`), its telemetry is installed, and a worker of it checks the
    agents and the database before it takes any task.

    Raises:
        SettingsError: An environment variable holds an unusable value.
        ScheduleError: `AGENT_RUNNER_SCHEDULES` names schedules that cannot be loaded.
    """
    settings = settings if settings is not None else WorkerSettings.from_env()
    app = create_app(settings)
    register_turn_tasks(app)
    register_beat_tasks(app)
    # Connected before the process hooks, so that the metrics directory exists before anything else runs.
    celery_signals.install(app, settings)
    install_process_hooks(app, settings)
    return app
