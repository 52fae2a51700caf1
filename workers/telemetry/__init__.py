"""Observability for operators: OpenTelemetry traces, Prometheus metrics and structured logs.

`instrument(runner)` is the one entry point for a runner: it adds a middleware that wraps
every step, model call and tool call (spans, step metrics, the log context), an event
listener (ended turns, retries, resumes), and the hook that stores a new turn's trace
context in its snapshot. `workers.telemetry.celery_signals.install(app, settings)` does the
Celery side (trace context and enqueue time in message headers, queue delay, sweep
results, the `/metrics` endpoint of a worker, the log format).

Everything is optional: without `opentelemetry-api` there are no spans, without
`prometheus-client` no metrics, and this package imports neither until they are needed.
Install them with the `otel` and `metrics` extras.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

from agent_runner import AgentRunner
from agent_runner.telemetry_hooks import set_new_turn_hook
from workers.telemetry.logs import configure_logging
from workers.telemetry.metrics import (
    TelemetryError,
    metrics_available,
    metrics_enabled,
    record_admission,
    record_lease_takeover,
    record_resume,
    render_metrics,
    resume_action,
    set_admission_gauges,
    set_metrics_enabled,
)
from workers.telemetry.middleware import MetricsListener, TelemetryMiddleware

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

WORKER_SERVICE_NAME = "agent-runner-worker"
"""The default `service.name` of processes that step turns for others (Celery and embedded workers)."""

__all__ = [
    "WORKER_SERVICE_NAME",
    "TelemetryError",
    "TelemetryMiddleware",
    "configure_logging",
    "instrument",
    "metrics_available",
    "metrics_enabled",
    "record_admission",
    "record_lease_takeover",
    "record_resume",
    "render_metrics",
    "resume_action",
    "set_admission_gauges",
    "set_metrics_enabled",
    "tracing_available",
]


@functools.cache
def _api_installed() -> bool:
    # Looked up without importing anything: `opentelemetry` is a namespace package shared by
    # every OpenTelemetry distribution, and only the API brings its `trace` package.
    spec = importlib.util.find_spec("opentelemetry")
    locations = spec.submodule_search_locations if spec is not None else None
    return any(os.path.isdir(os.path.join(path, "trace")) for path in locations or ())


def tracing_available() -> bool:
    """Whether spans can be made: `opentelemetry-api` is installed and OTEL_SDK_DISABLED is not true."""
    if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    return _api_installed()


def instrument(
    runner: AgentRunner,
    *,
    service_name: str | None = None,
    tracing: bool | None = None,
    metrics: bool | None = None,
    tracer_provider: TracerProvider | None = None,
) -> TelemetryMiddleware:
    """Trace, count and log-annotate every step of `runner`; idempotent.

    Args:
        runner: The runner to instrument (its middleware list gets the telemetry middleware first).
        service_name: `service.name` if this call configures tracing from the OTEL_* variables
            and OTEL_SERVICE_NAME is unset.
        tracing: Make spans (default: when `tracing_available()`). They are recorded only
            once a tracer provider exists: `tracer_provider`, one the application installed,
            or the one configured here from OTEL_* (see `tracing.configure_tracing`).
        metrics: Record Prometheus metrics (default: `metrics_enabled()`). Metrics switched off
            for the process (AGENT_RUNNER_METRICS=off, `set_metrics_enabled(False)`) stay off.
        tracer_provider: Send spans here instead of to the global provider.

    Returns:
        The middleware, registered outermost on `runner`.

    Raises:
        TelemetryError: Tracing or metrics were asked for but their package is not installed.
    """
    for item in runner.middleware:
        if isinstance(item, TelemetryMiddleware):
            return item
    if tracing and not tracing_available():
        raise TelemetryError("tracing needs opentelemetry-api: pip install 'agent-runner[otel]'")
    if metrics and not metrics_available():
        raise TelemetryError("metrics need prometheus-client: pip install 'agent-runner[metrics]'")
    use_tracing = tracing_available() if tracing is None else tracing
    record_metrics = metrics_enabled() if metrics is None else metrics
    tracer = None
    if use_tracing:
        from workers.telemetry.tracing import TurnTracer, configure_tracing

        if tracer_provider is None:
            configure_tracing(service_name)
        tracer = TurnTracer(tracer_provider)
        set_new_turn_hook(runner, tracer.new_turn_context)
    middleware = TelemetryMiddleware(runner, tracer, record_metrics)
    runner.middleware.insert(0, middleware)
    if record_metrics:
        runner.add_event_listener(MetricsListener())
    return middleware
