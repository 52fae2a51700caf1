"""Structured logs: the current turn on every log line, and one JSON object per line on request.

`StepContextFilter` copies the step context (`agent_runner.telemetry_hooks.current_step`: turn id,
root turn id, agent id, attempt) and the current trace and span ids onto each record. It
is installed on handlers, so it sees the records of every logger that reaches them.
Outside a step, inside a Celery task that names a turn, the record still gets the turn id.

`AGENT_RUNNER_LOG_FORMAT=json` switches a handler to `JsonFormatter`: one JSON object per
line with `timestamp`, `level`, `logger`, `message`, the context fields that are set, any
`extra=` fields, and `exception` when there is one. `text` (the default) keeps the
handler's own format and appends the context fields as `key=value` when a turn is known.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from agent_runner.errors import InputLimitError
from agent_runner.limits import check_id
from agent_runner.telemetry_hooks import current_step
from workers.settings import SettingsError

LOG_FORMAT_VARIABLE = "AGENT_RUNNER_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
CONTEXT_FIELDS = ("turn_id", "root_turn_id", "agent_id", "attempt")
TRACE_FIELDS = ("trace_id", "span_id")

_task_turn: ContextVar[str | None] = ContextVar("agent_runner_task_turn", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()
    | {"message", "asctime", "taskName", *CONTEXT_FIELDS, *TRACE_FIELDS}
)


def set_task_turn(turn_id: str | None) -> None:
    """Name the turn the current task works on, for lines logged outside its steps.

    The id comes from the task message, which may be forged: one that is not a valid turn id
    is not logged (the task itself rejects the message).
    """
    if turn_id is not None:
        try:
            check_id(turn_id, "turn_id")
        except InputLimitError:
            turn_id = None
    _task_turn.set(turn_id)


def _no_span_ids() -> tuple[str, str] | None:
    return None


def _span_ids_reader() -> Callable[[], tuple[str, str] | None]:
    from workers.telemetry import tracing_available

    if not tracing_available():
        return _no_span_ids
    from opentelemetry import trace

    def read() -> tuple[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    return read


_span_ids: Callable[[], tuple[str, str] | None] | None = None
"""Reads the current trace and span ids; resolved on first use, so that importing this module imports no OpenTelemetry."""


class StepContextFilter(logging.Filter):
    """Adds `turn_id`, `root_turn_id`, `agent_id`, `attempt`, `trace_id` and `span_id` to records (None when unknown)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate `record`; never drops it."""
        step = current_step()
        if step is not None:
            values: tuple[Any, ...] = (step.turn_id, step.root_turn_id, step.agent_id, step.attempt)
        else:
            values = (_task_turn.get(), None, None, None)
        for name, value in zip(CONTEXT_FIELDS, values, strict=True):
            if getattr(record, name, None) is None:  # an explicit extra= value wins
                setattr(record, name, value)
        global _span_ids
        if _span_ids is None:
            _span_ids = _span_ids_reader()
        ids = _span_ids()
        for name, value in zip(TRACE_FIELDS, ids or (None, None), strict=True):
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as a single-line JSON object."""
        data: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for name in (*CONTEXT_FIELDS, *TRACE_FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRIBUTES and name not in data and not name.startswith("_"):
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class ContextTextFormatter(logging.Formatter):
    """Keeps a handler's own text format and appends the turn's context fields when there is one."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter(logging.BASIC_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The inner format, then ` turn_id=... root_turn_id=... agent_id=... attempt=...` for the fields set."""
        text = self.inner.format(record)
        fields = [(name, getattr(record, name, None)) for name in CONTEXT_FIELDS]
        shown = " ".join(f"{name}={value}" for name, value in fields if value is not None)
        return f"{text} [{shown}]" if shown else text


def log_format(value: str | None = None) -> str:
    """The log format to use: `value`, else AGENT_RUNNER_LOG_FORMAT, else `text`.

    Raises:
        SettingsError: The format is neither `text` nor `json`.
    """
    chosen = (value if value is not None else os.environ.get(LOG_FORMAT_VARIABLE) or "text").strip().lower()
    if chosen not in LOG_FORMATS:
        raise SettingsError(LOG_FORMAT_VARIABLE, chosen, "expected text or json")
    return chosen


def install_on_handlers(handlers: Iterable[logging.Handler], fmt: str) -> None:
    """Give `handlers` the step-context filter and the `fmt` formatter (idempotent)."""
    for handler in handlers:
        if not any(isinstance(f, StepContextFilter) for f in handler.filters):
            handler.addFilter(StepContextFilter())
        current = handler.formatter
        if fmt == "json":
            if not isinstance(current, JsonFormatter):
                handler.setFormatter(JsonFormatter())
        elif not isinstance(current, ContextTextFormatter | JsonFormatter):
            handler.setFormatter(ContextTextFormatter(current))


def configure_logging(
    fmt: str | None = None, *, loggers: Iterable[str | logging.Logger] = (), level: int | None = None
) -> str:
    """Install the step context and the log format on the handlers of the root logger and `loggers`.

    A root logger without handlers gets one on standard error. For an ASGI server, pass its
    own loggers too (for example `("uvicorn", "uvicorn.access", "uvicorn.error")`).

    Args:
        fmt: `text` or `json` (default: AGENT_RUNNER_LOG_FORMAT, else `text`).
        loggers: Further loggers whose handlers get the same treatment.
        level: Level for the root logger, when given.

    Returns:
        The format installed.

    Raises:
        SettingsError: The format is neither `text` nor `json`.
    """
    chosen = log_format(fmt)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    if level is not None:
        root.setLevel(level)
    targets = [root, *(logging.getLogger(item) if isinstance(item, str) else item for item in loggers)]
    for target in targets:
        install_on_handlers(target.handlers, chosen)
    return chosen


SERVICE_LOGGER = "workers"
"""The loggers whose INFO lines a long-running command shows: start-up, sweeps, scheduled ticks."""


def configure_service_logging(loggers: Iterable[str | logging.Logger] = ()) -> str:
    """Logging of a long-running command (`agent-runner worker`, `agent-runner serve`).

    The log format of `configure_logging`, and the INFO lines of `workers.*`, which the
    default WARNING level would hide. A level set on the `workers` logger beforehand (by
    the application, or a logging configuration file) is kept.

    Returns:
        The format installed.
    """
    chosen = configure_logging(loggers=loggers)
    ours = logging.getLogger(SERVICE_LOGGER)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)
    return chosen
