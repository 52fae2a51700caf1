"""Prometheus metrics of turns, steps, resumes, retries, leases, queues and sweeps.

The metric names are part of the contract (DESIGN.md, section 8); every label has a small
fixed set of values (agent ids come from the deployment's agents, never from requests):

| metric | type | labels |
|---|---|---|
| `agent_runner_steps_total` | counter | `agent_id`, `kind` (model, tool, suspend, children, terminal, conflict, noop, error) |
| `agent_runner_step_duration_seconds` | histogram | `agent_id`, `kind` |
| `agent_runner_turns_ended_total` | counter | `status` (the terminal statuses) |
| `agent_runner_resumes_total` | counter | `action` (input, form, approve, reject, retry, child_completed, tool_result, deadline, retry_due, limit_wait_over), `outcome` (accepted, rejected) |
| `agent_runner_retries_scheduled_total` | counter | - |
| `agent_runner_model_limit_waits_total` | counter | `limit_key` (the keys of `AGENT_RUNNER_MODEL_LIMITS`), `reason` (the `LimitReason` values) |
| `agent_runner_admissions_total` | counter | `tenant` (the deployment's tenants; `none` for turns without one), `waited` (true, false) |
| `agent_runner_admission_waiting` | gauge | `tenant`: new turns waiting for admission (`AGENT_RUNNER_ADMISSION_WINDOW`) |
| `agent_runner_admission_in_flight` | gauge | `tenant`: turns admitted or running, not ended or waiting for a person |
| `agent_runner_lease_takeovers_total` | counter | - |
| `agent_runner_queue_delay_seconds` | histogram | - |
| `agent_runner_sweeps_total` | counter | `sweep` (the counted sweeps of `workers.sweeps.SWEEPS`: inbox, stale_turns, due_retries, deadlines) |
| `agent_runner_sweep_enqueued_total` | counter | `sweep` (for deadlines: the turns reminded or resumed by their default) |

`prometheus-client` is imported on first use only, so that a Celery worker can point
PROMETHEUS_MULTIPROC_DIR at its directory before anything creates a metric (see
`prepare_multiprocess_dir`). Every `record_*` function is a no-op when the package is not
installed or metrics are disabled.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, assert_never

from agent_runner import AgentResumeCommand, AgentRunnerError, AgentTurnStatus, ResumeType
from agent_runner.model_limits import WAIT_OVER_REASON
from agent_runner.snapshot import TERMINAL_STATUSES
from workers.celery_app.names import SWEEP_LABELS

if TYPE_CHECKING:
    from workers.telemetry._prometheus import MetricsServer, PrometheusMetrics

logger = logging.getLogger("workers.telemetry")

MULTIPROC_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
METRICS_SWITCH_VARIABLE = "AGENT_RUNNER_METRICS"

STEP_KINDS = frozenset({"model", "tool", "suspend", "children", "terminal", "conflict", "noop", "error"})
RESUME_ACTIONS = frozenset(
    {
        "input",
        "form",
        "approve",
        "reject",
        "retry",
        "child_completed",
        "tool_result",
        "deadline",
        "retry_due",
        "limit_wait_over",
    }
)
RESUME_OUTCOMES = frozenset({"accepted", "rejected"})
_ENDED_STATUSES = frozenset(status.value for status in TERMINAL_STATUSES)


class TelemetryError(AgentRunnerError):
    """Telemetry was asked for something it cannot do (a missing package, a label outside its set)."""


def metrics_available() -> bool:
    """Whether `prometheus-client` is installed."""
    return importlib.util.find_spec("prometheus_client") is not None


_enabled: bool | None = None
"""Set by `set_metrics_enabled`; else decided once from the environment."""
_metrics: PrometheusMetrics | None = None
_lock = threading.Lock()


def metrics_enabled() -> bool:
    """Whether `record_*` calls count: `prometheus-client` is installed and metrics are not switched off.

    `AGENT_RUNNER_METRICS=off` (or `0`, `false`) switches them off; it is read on first use.
    `set_metrics_enabled` overrides both.
    """
    global _enabled
    if _enabled is None:
        switch = (os.environ.get(METRICS_SWITCH_VARIABLE) or "").strip().lower()
        _enabled = switch not in ("0", "off", "false", "no") and metrics_available()
    return _enabled


def set_metrics_enabled(enabled: bool | None) -> None:
    """Force metrics on or off in this process (None: decide again from the environment on next use).

    Raises:
        TelemetryError: Metrics were switched on but `prometheus-client` is not installed.
    """
    global _enabled
    if enabled and not metrics_available():
        raise TelemetryError("metrics need prometheus-client: pip install 'agent-runner[metrics]'")
    _enabled = enabled


def _get() -> PrometheusMetrics | None:
    global _metrics
    if not (_enabled if _enabled is not None else metrics_enabled()):
        return None
    if _metrics is None:
        with _lock:
            if _metrics is None:
                from workers.telemetry._prometheus import PrometheusMetrics

                _metrics = PrometheusMetrics()
    return _metrics


def _check(label: str, value: str, allowed: frozenset[str]) -> str:
    if value not in allowed:
        raise TelemetryError(f"{label}={value!r} is not one of {sorted(allowed)}")
    return value


# --- Recording ----------------------------------------------------------------------------------


def record_step(agent_id: str, kind: str, seconds: float) -> None:
    """Count one step of an agent and observe how long it took."""
    metrics = _get()
    if metrics is not None:
        metrics.step(agent_id, _check("kind", kind, STEP_KINDS), seconds)


def record_turn_ended(status: str | AgentTurnStatus) -> None:
    """Count a turn that reached a terminal status."""
    metrics = _get()
    if metrics is not None:
        metrics.turns_ended.labels(_check("status", str(status), _ENDED_STATUSES)).inc()


def record_resume(action: str, outcome: str = "accepted") -> None:
    """Count a resume command by action and outcome.

    Accepted resumes are counted from the runner's TURN_RESUMED events by `instrument`; an
    HTTP API or command line calls this with `outcome="rejected"` when it refuses a command
    (an `InvalidResumeCommand`), with the action from `resume_action`.

    Raises:
        TelemetryError: `action` or `outcome` is outside its fixed set.
    """
    _check("action", action, RESUME_ACTIONS)
    _check("outcome", outcome, RESUME_OUTCOMES)
    metrics = _get()
    if metrics is not None:
        metrics.resumes.labels(action, outcome).inc()


def resume_action(command: AgentResumeCommand) -> str:
    """The `action` label of a resume command (`input` for text, `form` for form data, ...)."""
    return _action(command.type, with_form_data=command.data is not None)


def resume_action_of_event(data: Mapping[str, Any]) -> str:
    """The `action` label of a TURN_RESUMED event's data.

    Raises:
        TelemetryError: The event names a command this code does not know.
    """
    command = data.get("command")
    if command is None:
        # The runner picked up a turn whose wait was over: a retry, or a wait for a model limit.
        return "limit_wait_over" if data.get("reason") == WAIT_OVER_REASON else "retry_due"
    try:
        kind = ResumeType(str(command))
    except ValueError:
        raise TelemetryError(f"unknown resume command type {command!r}") from None
    # The event carries the call id of a form submission, not its data.
    return _action(kind, with_form_data=bool(data.get("tool_call_id")))


def _action(kind: ResumeType, *, with_form_data: bool) -> str:
    match kind:
        case ResumeType.USER_INPUT:
            return "form" if with_form_data else "input"
        case ResumeType.APPROVE_TOOL:
            return "approve"
        case ResumeType.REJECT_TOOL:
            return "reject"
        case ResumeType.CHILD_COMPLETED:
            return "child_completed"
        case ResumeType.RETRY:
            return "retry"
        case ResumeType.TOOL_RESULT:
            return "tool_result"
        case ResumeType.DEADLINE:
            return "deadline"
        case ResumeType.EDIT_TOOL:
            return "edit"
        case _:
            assert_never(kind)


def record_retry_scheduled() -> None:
    """Count a recoverable failure that scheduled another attempt."""
    metrics = _get()
    if metrics is not None:
        metrics.retries.inc()


def record_model_limit_wait(limit_key: str, reason: str) -> None:
    """Count a model call that waits for a shared model limit (no attempt used)."""
    metrics = _get()
    if metrics is not None:
        metrics.limit_waits.labels(limit_key, reason).inc()


def _tenant_label(tenant: str | None) -> str:
    return "none" if tenant is None else tenant


def record_admission(tenant: str | None, *, waited: bool) -> None:
    """Count a new turn lined up for admission, and whether it had to wait."""
    metrics = _get()
    if metrics is not None:
        metrics.admissions.labels(_tenant_label(tenant), "true" if waited else "false").inc()


def set_admission_gauges(tenant: str | None, waiting: int, in_flight: int) -> None:
    """Set the tenant's turns waiting for admission and in flight, as the admission just reported them."""
    metrics = _get()
    if metrics is not None:
        label = _tenant_label(tenant)
        metrics.admission_waiting.labels(label).set(waiting)
        metrics.admission_in_flight.labels(label).set(in_flight)


def record_lease_takeover() -> None:
    """Count a worker finding that another worker took over a turn it was stepping.

    Call it where a lease is found lost: a renewal refused, or a save refused by the fence.
    """
    metrics = _get()
    if metrics is not None:
        metrics.takeovers.inc()


def record_queue_delay(seconds: float) -> None:
    """Observe the time from a step's enqueue (or its ETA) to the step starting."""
    metrics = _get()
    if metrics is not None:
        metrics.queue_delay.observe(max(0.0, seconds))


def record_sweep(sweep: str, enqueued: int) -> None:
    """Count one run of a beat sweep and the items it re-enqueued."""
    metrics = _get()
    if metrics is not None:
        _check("sweep", sweep, SWEEP_LABELS)
        metrics.sweeps.labels(sweep).inc()
        metrics.sweep_enqueued.labels(sweep).inc(max(0, enqueued))


# --- Exposition ---------------------------------------------------------------------------------


def render_metrics() -> tuple[bytes, str]:
    """The Prometheus text of this process (or of every process sharing PROMETHEUS_MULTIPROC_DIR).

    Returns:
        The body and its content type, for an HTTP `/metrics` route.

    Raises:
        TelemetryError: `prometheus-client` is not installed.
    """
    if not metrics_available():
        raise TelemetryError("metrics need prometheus-client: pip install 'agent-runner[metrics]'")
    from workers.telemetry import _prometheus

    _get()  # create the families, so that they show before the first event
    return _prometheus.render(os.environ.get(MULTIPROC_DIR_VARIABLE))


def serve_metrics(port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve `/metrics` over HTTP from a background thread of this process.

    With PROMETHEUS_MULTIPROC_DIR set, the page merges every process writing there (the
    pool processes of a prefork worker), and folds the files of processes that died into
    one archive per metric type so the directory does not grow with process churn.

    Raises:
        TelemetryError: `prometheus-client` is not installed.
        OSError: The port cannot be bound.
    """
    if not metrics_available():
        raise TelemetryError("metrics need prometheus-client: pip install 'agent-runner[metrics]'")
    from workers.telemetry import _prometheus

    return _prometheus.serve(port, addr, os.environ.get(MULTIPROC_DIR_VARIABLE))


def start_metrics_server(port: int, addr: str) -> MetricsServer | None:
    """Serve `/metrics` for a worker process, or log why not: metrics never keep a worker from running turns.

    Returns:
        The running server; None when metrics are off or the port cannot be bound (logged).
    """
    if not metrics_enabled():
        logger.warning("AGENT_RUNNER_METRICS_PORT is set but metrics are off (install agent-runner[metrics])")
        return None
    try:
        return serve_metrics(port, addr)
    except OSError as exc:
        logger.error("could not serve metrics on %s:%s: %s", addr, port, exc)
        return None


def prepare_multiprocess_dir(directory: str | None = None) -> tuple[str, bool]:
    """Point PROMETHEUS_MULTIPROC_DIR at an empty directory, before pool processes fork.

    Uses `directory`, else the variable's value, else a new temporary directory. Files left
    by an earlier run are removed: their processes are gone and their counts belong to a
    previous life of the worker.

    Returns:
        The directory and whether it was created here (then `remove_multiprocess_dir` drops it at exit).
    """
    directory = directory or os.environ.get(MULTIPROC_DIR_VARIABLE)
    created = False
    if directory:
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".db"):
                os.remove(os.path.join(directory, name))
    else:
        directory = tempfile.mkdtemp(prefix="agent-runner-metrics-")
        created = True
    os.environ[MULTIPROC_DIR_VARIABLE] = directory
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        # prometheus-client picks its value class when first imported; metrics created from
        # now on must write to the shared files.
        setattr(values, "ValueClass", getattr(values, "get_value_class")())  # noqa: B009, B010
        if _metrics is not None:
            logger.warning("agent-runner metrics were created before multiprocess mode; restart to share them")
    return directory, created


def remove_multiprocess_dir(directory: str) -> None:
    """Delete a directory made by `prepare_multiprocess_dir` (worker shutdown)."""
    shutil.rmtree(directory, ignore_errors=True)


def mark_process_dead(pid: int) -> None:
    """Drop the live-gauge files of a pool process that is exiting (multiprocess mode only)."""
    directory = os.environ.get(MULTIPROC_DIR_VARIABLE)
    if directory and metrics_available():
        from workers.telemetry import _prometheus

        _prometheus.mark_process_dead(pid, directory)
