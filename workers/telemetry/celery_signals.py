"""Telemetry of the Celery processes, through Celery signals: `install(app, settings)` connects it all.

- Publish (`before_task_publish`, in any process that sends a task: `create_app` connects
  it): the message gets the
  enqueue time and the trace context of the span that sent it (the step that dispatched
  the next one, the request that resumed a turn).
- Task start and end (`task_prerun`, `task_postrun`): a `step_turn` observes its queue
  delay (from the enqueue time, or its ETA when that is later), remembers the sender's
  span for the links of its steps, and names its turn in the log context; a sweep counts
  its run and what it re-enqueued.
- Worker main process (`worker_init`, `worker_ready`, `worker_shutdown`): with
  AGENT_RUNNER_METRICS_PORT set, prepares the multiprocess metrics directory before the
  pool forks, serves `/metrics` on that port once the worker is ready, and cleans up.
- Pool processes (`worker_process_init`, `worker_process_shutdown`): tracing is configured
  in each process after the fork; on exit buffered spans are flushed and the process's
  live metric files dropped.
- Logging (`after_setup_logger`, `after_setup_task_logger`): the step context on every
  line, and AGENT_RUNNER_LOG_FORMAT (`text` or `json`) on Celery's handlers.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from workers.celery_app.names import STEP_TURN
from workers.settings import WorkerSettings
from workers.sweeps import SWEEPS
from workers.telemetry import WORKER_SERVICE_NAME, logs, metrics, tracing_available

if TYPE_CHECKING:
    from workers.telemetry._prometheus import MetricsServer

logger = logging.getLogger("workers.telemetry")

ENQUEUED_AT_HEADER = "agent_runner_enqueued_at"
"""Message header: UNIX time at which the message was published."""
TRACE_HEADER = "agent_runner_trace"
"""Message header: the trace context (a text carrier) of the span that published the message."""

STEP_TASK = STEP_TURN
SWEEP_TASKS = {sweep.task: sweep.name for sweep in SWEEPS if sweep.counted}
"""Task name -> `sweep` label, for the sweeps whose runs the metrics count."""
TASK_PREFIX = "agent_runner."


class CeleryTelemetry:
    """The signal handlers for one Celery app and its settings."""

    def __init__(self, app: Celery, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.server: MetricsServer | None = None
        self.metrics_dir: str | None = None
        self.created_dir: str | None = None

    # --- worker main process --------------------------------------------------------------

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        """Prepare shared metric files before the pool forks; name this service for traces."""
        if getattr(sender, "app", None) is not self.app:
            return
        if tracing_available():
            from workers.telemetry.tracing import set_default_service_name

            set_default_service_name(WORKER_SERVICE_NAME)
        if self.settings.metrics_port is not None and metrics.metrics_enabled():
            directory, created = metrics.prepare_multiprocess_dir()
            self.metrics_dir = directory
            self.created_dir = directory if created else None

    def on_worker_ready(self, sender: Any = None, **_: Any) -> None:
        """Serve `/metrics` on AGENT_RUNNER_METRICS_PORT from the main process."""
        if getattr(sender, "app", None) is not self.app or self.settings.metrics_port is None:
            return
        self.server = metrics.start_metrics_server(self.settings.metrics_port, self.settings.metrics_addr)
        if self.server is None:
            return
        # Logged here, not at worker_init: Celery sets up its log handlers in between.
        logger.info(
            "serving metrics on http://%s:%s/metrics, collected from the pool processes in %s",
            self.settings.metrics_addr,
            self.server.port,
            self.metrics_dir,
        )

    def on_worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        """Stop the metrics server and remove a metrics directory made at start-up."""
        if getattr(sender, "app", None) is not self.app:
            return
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.created_dir is not None:
            metrics.remove_multiprocess_dir(self.created_dir)
            self.created_dir = None

    # --- pool processes -------------------------------------------------------------------

    def on_worker_process_init(self, **_: Any) -> None:
        """Configure tracing in a new pool process (span exporters do not survive a fork)."""
        if self.server is not None:
            # Forked after the server started (a replaced pool process): drop its socket.
            self.server.forget_in_child()
            self.server = None
        if tracing_available():
            from workers.telemetry.tracing import configure_tracing

            configure_tracing(WORKER_SERVICE_NAME)

    def on_worker_process_shutdown(self, pid: int | None = None, **_: Any) -> None:
        """Flush buffered spans and drop this process's live metric files."""
        if tracing_available():
            from workers.telemetry.tracing import flush_tracing

            flush_tracing()
        metrics.mark_process_dead(pid or os.getpid())

    def on_task_prerun(self, task: Any = None, args: Any = None, **_: Any) -> None:
        """Observe a step task's queue delay and set up its trace links and log context."""
        if task is None or task.name != STEP_TASK:
            return
        request = task.request
        enqueued_at = getattr(request, ENQUEUED_AT_HEADER, None)
        if isinstance(enqueued_at, int | float):
            due = max(float(enqueued_at), _timestamp(getattr(request, "eta", None)) or 0.0)
            metrics.record_queue_delay(time.time() - due)
        if tracing_available():
            from workers.telemetry.tracing import begin_task

            carrier = getattr(request, TRACE_HEADER, None)
            begin_task(carrier if isinstance(carrier, dict) else None)
        if args:
            logs.set_task_turn(str(args[0]))

    def on_task_postrun(self, task: Any = None, retval: Any = None, **_: Any) -> None:
        """Count a sweep's result; forget a step task's context."""
        if task is None:
            return
        sweep = SWEEP_TASKS.get(task.name)
        if sweep is not None and isinstance(retval, int):
            metrics.record_sweep(sweep, retval)
        if task.name == STEP_TASK:
            logs.set_task_turn(None)
            if tracing_available():
                from workers.telemetry.tracing import end_task

                end_task()

    # --- logging --------------------------------------------------------------------------

    def on_setup_logger(self, logger: logging.Logger | None = None, **_: Any) -> None:
        """Step context and AGENT_RUNNER_LOG_FORMAT on the handlers Celery just set up."""
        if logger is not None:
            logs.install_on_handlers(logger.handlers, self.settings.log_format)

    def connect(self) -> None:
        """Connect every handler (strongly: this object lives as long as the app)."""
        signals.worker_init.connect(self.on_worker_init, weak=False)
        signals.worker_ready.connect(self.on_worker_ready, weak=False)
        signals.worker_shutdown.connect(self.on_worker_shutdown, weak=False)
        signals.worker_process_init.connect(self.on_worker_process_init, weak=False)
        signals.worker_process_shutdown.connect(self.on_worker_process_shutdown, weak=False)
        connect_publishing()
        signals.task_prerun.connect(self.on_task_prerun, weak=False)
        signals.task_postrun.connect(self.on_task_postrun, weak=False)
        signals.after_setup_logger.connect(self.on_setup_logger, weak=False)
        signals.after_setup_task_logger.connect(self.on_setup_logger, weak=False)


def stamp_message(sender: Any = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """`before_task_publish`: the enqueue time and the sender's trace context on an agent-runner message."""
    if headers is None or not isinstance(sender, str) or not sender.startswith(TASK_PREFIX):
        return
    headers[ENQUEUED_AT_HEADER] = time.time()
    if tracing_available():
        from workers.telemetry.tracing import inject_headers

        carrier: dict[str, str] = {}
        inject_headers(carrier)
        if carrier:
            headers[TRACE_HEADER] = carrier


def connect_publishing() -> None:
    """Stamp every agent-runner message this process sends (once per process, whichever app sends it).

    Every app that sends tasks connects it (`workers.celery_app.config.create_app`), so a
    web process that resumes a turn puts its request's trace context on the step it enqueues.
    """
    signals.before_task_publish.connect(stamp_message, weak=False, dispatch_uid=_PUBLISH_UID)


_PUBLISH_UID = "agent_runner.stamp_message"


def _timestamp(value: Any) -> float | None:
    """A message's ETA (ISO text or datetime) as UNIX time, or None."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def install(app: Celery, settings: WorkerSettings) -> CeleryTelemetry:
    """Connect the telemetry signal handlers for `app`, configured by `settings`."""
    telemetry = CeleryTelemetry(app, settings)
    telemetry.connect()
    return telemetry
