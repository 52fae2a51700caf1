"""The state of a Celery worker process: the app it serves, its start-up checks and its wiring, built on first use.

`install_process_hooks(app, settings)` connects the handlers of the worker signals for one
app: a worker of that app that could not run any turn refuses to start, records how many
tasks a process runs at once, and closes its connections on the way out. `current()` is
the `ProcessBackends` the tasks of that worker run with.

Built lazily, per process: Celery's prefork pool forks its children after the app is
created, and a database connection pool or Redis socket inherited across a fork would be
shared by two processes.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from celery import Celery, signals

from workers.settings import SettingsError, WorkerSettings
from workers.wiring import ProcessBackends, build_wiring

logger = logging.getLogger("workers")


@dataclass(frozen=True)
class _Served:
    """The app whose worker runs in this process, its settings, and the tasks each of its processes runs at once."""

    app: Celery
    settings: WorkerSettings
    tasks_per_process: int = 1


_served: _Served | None = None
_current: tuple[int, ProcessBackends] | None = None
_current_lock = threading.Lock()


def current() -> ProcessBackends:
    """The wiring of this worker process, built on first use from the settings of the app the worker serves.

    Raises:
        RuntimeError: No worker of an app with these hooks started in this process.
    """
    global _current
    pid = os.getpid()
    with _current_lock:
        # A forked child must not reuse the parent's pools; it builds its own.
        if _current is None or _current[0] != pid:
            served = _served
            if served is None:
                raise RuntimeError("no agent-runner Celery worker started in this process")
            from workers.celery_app.middleware import SoftTimeLimitAsRetry

            wiring = build_wiring(
                served.settings,
                served.app,
                middleware=[SoftTimeLimitAsRetry()],
                tasks_in_flight=served.tasks_per_process,
            )
            _current = (pid, wiring)
        return _current[1]


def close_current() -> None:
    """Close the wiring of this process, if it was built (worker process shutdown)."""
    global _current
    with _current_lock:
        built, _current = _current, None
    if built is not None and built[0] == os.getpid():
        try:
            built[1].close()
        except Exception:
            logger.exception("closing the worker's connections failed")


class _ProcessHooks:
    """The worker signal handlers of one app (a process may hold other Celery apps; their workers are left alone)."""

    def __init__(self, app: Celery, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings

    def check_agents(self, sender: Any = None, **_: Any) -> None:
        """Refuse to start a worker that could not run any turn, rather than fail every task later.

        It checks the agents, the runner set-up and the database: its schema must be at the
        revision this code needs (`agent-runner db upgrade` otherwise).
        """
        if getattr(sender, "app", None) is not self.app:
            return  # a worker of another Celery app in a process that created this one
        from agent_runner import StoreError
        from workers.agents import load_agent_loader, load_runner_setup
        from workers.database import check_database

        settings = self.settings
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

    def serve(self, sender: Any = None, **_: Any) -> None:
        """Make this app the one this process's tasks run for, and warn about what limits its capacity."""
        global _served
        if getattr(sender, "app", None) is not self.app:
            return
        from workers.capacity import capacity_warnings, pool_name, tasks_per_process

        pool = pool_name(getattr(sender, "pool_cls", "prefork"))
        concurrency = int(getattr(sender, "concurrency", 1) or 1)
        _served = _Served(self.app, self.settings, tasks_per_process(pool, concurrency))
        for warning in capacity_warnings(self.settings, pool, concurrency):
            logger.warning("%s", warning)

    def close(self, **_: Any) -> None:
        """Close this process's database pool and Redis connections on the way out."""
        close_current()


def install_process_hooks(app: Celery, settings: WorkerSettings) -> None:
    """Connect the worker signal handlers of `app` (see the module docstring)."""
    hooks = _ProcessHooks(app, settings)
    # Connected by call rather than as decorators: Celery is untyped, and a decorator would
    # hide the handlers' signatures from the type checker.
    signals.worker_init.connect(hooks.check_agents, weak=False)
    signals.worker_init.connect(hooks.serve, weak=False)
    signals.worker_process_shutdown.connect(hooks.close, weak=False)
