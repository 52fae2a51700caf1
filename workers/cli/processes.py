"""`agent-runner worker`, `serve` and `demo`: the processes that run turns."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import signal
import sys
import threading
import time
from typing import Any

import click

from workers.cli.common import EXIT_BAD_INPUT, fail
from workers.cli.context import CliContext, pass_context


class Seconds(click.FloatRange):
    """A number of seconds in a range; NaN and infinity are refused (a plain FloatRange lets NaN through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Convert like FloatRange, then refuse what is not finite."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


@click.command()
def demo() -> None:
    """Run the support-desk demo on a temporary SQLite file."""
    from workers.demo import main as run_demo

    sys.exit(run_demo([]))


@click.command()
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=64,
    show_default=True,
    help="Stepping threads: turns in flight at once (a turn waiting on its model holds one).",
)
@click.option(
    "--lease-ttl",
    type=Seconds(0.1, 3600.0),
    default=None,
    help="Seconds a turn lease lasts without renewal (default: AGENT_RUNNER_LEASE_TTL_S, else 30).",
)
@click.option(
    "--poll-interval",
    type=Seconds(0.01, 3600.0),
    default=0.5,
    show_default=True,
    help="Seconds between polls when idle.",
)
@click.option(
    "--run-for",
    type=Seconds(0.0, None),
    default=None,
    help="Stop after this many seconds (default: until Ctrl-C).",
)
@pass_context
def worker(
    obj: CliContext, concurrency: int, lease_ttl: float | None, poll_interval: float, run_for: float | None
) -> None:
    """Run the embedded AgentWorker (SQL leases, no Redis or Celery needed).

    Besides stepping turns it does what beat and the Celery tasks do for a Celery
    deployment: it applies approval and form deadlines and their reminders (every
    AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S seconds), starts queued inbox messages when
    their conversation frees, delivers the webhooks of AGENT_RUNNER_WEBHOOKS, and fires the
    scheduled turns of AGENT_RUNNER_SCHEDULES (each tick starts one turn, however many
    processes fire it).
    """
    from workers.embedded import Stepping, build_embedded
    from workers.telemetry import WORKER_SERVICE_NAME
    from workers.telemetry.logs import configure_service_logging
    from workers.telemetry.metrics import start_metrics_server

    settings = obj.settings()
    loader = obj.loader()
    database = obj.database()
    configure_service_logging()
    # A setup or schedules that cannot be used end the command with exit 2 (`Commands.main`).
    deployment = build_embedded(
        settings,
        database,
        loader,
        Stepping(concurrency, lease_ttl=lease_ttl, poll_interval=poll_interval),
        service_name=WORKER_SERVICE_NAME,
    )
    assert deployment.worker is not None  # built with a `Stepping`
    port = settings.metrics_port
    metrics_server = None if port is None else start_metrics_server(port, settings.metrics_addr)
    scheduler = deployment.scheduler
    names = ", ".join(schedule.name for schedule in scheduler.schedules) if scheduler is not None else ""
    firing = f", firing schedules {names}" if names else ""
    if metrics_server is not None:
        firing += f", metrics on http://{metrics_server.addr}:{metrics_server.port}/metrics"
    click.echo(
        f"worker {deployment.worker.owner} stepping turns with {concurrency} thread(s){firing}; "
        "Ctrl-C or SIGTERM stops",
        err=True,
    )
    # SIGTERM (docker stop, systemd, Kubernetes) stops as gracefully as Ctrl-C: steps in flight finish.
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    deployment.start()
    try:
        deadline = None if run_for is None else time.monotonic() + run_for
        while not stopping.is_set() and (deadline is None or time.monotonic() < deadline):
            stopping.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        deployment.stop()
        if metrics_server is not None:
            metrics_server.close()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option(
    "--agents", "agents_spec", default=None, help="module:attribute of the agents (default: --agents of the group)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option(
    "--worker",
    "worker_mode",
    type=click.Choice(["embedded", "celery", "none"]),
    default=None,
    help="Who steps turns: threads in this process, Celery workers, or nobody here "
    "(default: AGENT_RUNNER_API_WORKER, else embedded on SQLite and celery otherwise).",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=None, help="Threads of the embedded worker.")
@pass_context
def serve(
    obj: CliContext, agents_spec: str | None, host: str, port: int, worker_mode: str | None, concurrency: int | None
) -> None:
    """Serve the HTTP API (and the console) for web apps; see docs/http-api.md."""
    from agent_runner import AgentRunnerError
    from workers.agents import load_agent_loader
    from workers.settings import SettingsError

    try:
        import uvicorn  # noqa: F401 - checked here, so that a missing extra is one clear line

        from workers.api import ApiSettings, WorkerMode, create_app
        from workers.api.app import run_server
        from workers.telemetry.logs import configure_service_logging
    except ImportError as exc:
        fail(f"serving needs the api extra (pip install 'agent-runner[api]'): {exc}", EXIT_BAD_INPUT)
    spec = agents_spec or obj.agents
    if not spec:
        fail("give the agents to serve with --agents module:attribute (or AGENT_RUNNER_AGENT_LOADER)", EXIT_BAD_INPUT)
    try:
        loader = load_agent_loader(spec)
    except SettingsError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    try:
        settings = ApiSettings.from_env({**os.environ, "AGENT_RUNNER_DATABASE_URL": obj.database_url})
    except AgentRunnerError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if not settings.keys.enabled and not _is_loopback(host):
        fail(
            f"refusing to listen on {host}: without AGENT_RUNNER_API_KEYS the API has no authentication, "
            "so it only listens on a loopback address (127.0.0.1, ::1, localhost). Set "
            "AGENT_RUNNER_API_KEYS='tenant:key,...' to serve other hosts.",
            EXIT_BAD_INPUT,
        )
    if concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=concurrency)
    app = create_app(settings, agents=loader, worker=WorkerMode(worker_mode) if worker_mode else None)
    mode = app.state.settings.worker_mode.value
    click.echo(f"agent-runner API on http://{host}:{port} (docs at /docs, worker: {mode})", err=True)
    configure_service_logging()
    run_server(app, host, port)
