"""A runner for the processes that send work to the Celery workers: web apps, scripts, the HTTP server.

Its own module, apart from `workers.wiring`, because it needs the Celery app factory
(`workers.celery_app.config`), which the sweep table's modules would otherwise reach back
into from the wiring.
"""

from __future__ import annotations

from agent_runner import AgentRunner
from workers.celery_app.config import create_app
from workers.settings import WorkerSettings
from workers.wiring import build_wiring


def build_runner(settings: WorkerSettings | None = None) -> AgentRunner:
    """Return an `AgentRunner` wired from `settings` (default: the environment), for web apps and scripts.

    With `settings` given nothing comes from the environment: not the database, Redis,
    broker or queue, and `workers.app` (which reads the environment) is not imported.

    Its store, chat memory and conversation guard are the ones the workers use; its
    `start`, `submit_resume` and `cancel` save the turn and enqueue a `step_turn` message
    instead of running the turn in the calling thread. Agents come from
    `AGENT_RUNNER_AGENT_LOADER` when it is set; an `Agent` passed to `start` is registered
    in this runner's loader either way (the workers need it in theirs).

    Build it once at start-up and share it: every call opens its own database pool and
    Redis connections.

    Raises:
        SettingsError: An environment variable holds an unusable value.
    """
    settings = settings if settings is not None else WorkerSettings.from_env()
    # A producer only sends tasks by name: an app of its own, configured from `settings`,
    # whatever the environment of this process holds.
    return build_wiring(settings, create_app(settings)).runner
