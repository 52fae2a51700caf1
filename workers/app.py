"""The Celery app of agent-runner: `celery -A workers.app worker` and `celery -A workers.app beat`.

Configured from the environment at import (see `workers.settings`), with the configuration
of `workers.celery_config`. Code that has settings of its own builds an app with
`workers.celery_config.create_app(settings)` instead, without importing this module.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from workers.celery_config import celery_config as celery_config
from workers.celery_config import create_app as create_app
from workers.settings import SettingsError, WorkerSettings
from workers.telemetry import celery_signals as telemetry_signals  # telemetry hook

logger = logging.getLogger("workers")


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
signals.worker_process_shutdown.connect(_close_wiring, weak=False)
