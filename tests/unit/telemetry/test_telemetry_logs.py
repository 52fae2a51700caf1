"""Structured logs: the turn of the current step on every line, JSON on request."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tests.unit.telemetry.telemetry_kit import Tracing, build_agent, drive, new_runner
from workers.settings import SettingsError, WorkerSettings
from workers.telemetry import configure_logging, instrument
from workers.telemetry.logs import ContextTextFormatter, JsonFormatter, install_on_handlers, log_format, set_task_turn


@pytest.fixture
def captured() -> Iterator[tuple[logging.Handler, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tool")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler, stream
    finally:
        logger.removeHandler(handler)


def test_lines_logged_inside_a_step_carry_the_turn_and_the_trace_as_json(
    captured: tuple[logging.Handler, io.StringIO],
) -> None:
    handler, stream = captured
    install_on_handlers([handler], "json")
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)

    turn = drive(runner, build_agent(log=logging.getLogger("tool").info))
    logging.getLogger("tool").info("after the turn", extra={"request_id": "r-1"})

    during, after = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert during["message"] == "writing x"
    assert during["level"] == "INFO" and during["logger"] == "tool"
    assert (during["turn_id"], during["root_turn_id"], during["agent_id"], during["attempt"]) == (
        turn.id,
        turn.id,
        "assistant",
        0,
    )
    (tool_span,) = tracing.named("execute_tool approved_write")
    assert during["trace_id"] == format(tool_span.context.trace_id, "032x")
    assert during["span_id"] == format(tool_span.context.span_id, "016x")
    # Outside a step, no turn fields; extra= fields are kept
    assert "turn_id" not in after and "trace_id" not in after
    assert after["request_id"] == "r-1"


def test_text_lines_keep_their_format_and_append_the_turn(captured: tuple[logging.Handler, io.StringIO]) -> None:
    handler, stream = captured
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    install_on_handlers([handler], "text")
    install_on_handlers([handler], "text")  # idempotent
    runner = new_runner()
    instrument(runner, tracing=False, metrics=False)

    turn = drive(runner, build_agent(log=logging.getLogger("tool").info))
    logging.getLogger("tool").info("later")

    assert stream.getvalue().splitlines() == [
        f"INFO tool: writing x [turn_id={turn.id} root_turn_id={turn.id} agent_id=assistant attempt=0]",
        "INFO tool: later",
    ]
    assert isinstance(handler.formatter, ContextTextFormatter)


def test_a_task_names_its_turn_on_lines_outside_its_steps(captured: tuple[logging.Handler, io.StringIO]) -> None:
    handler, stream = captured
    install_on_handlers([handler], "json")
    set_task_turn("turn-7")
    try:
        logging.getLogger("tool").warning("lease held elsewhere")
    finally:
        set_task_turn(None)
    line = json.loads(stream.getvalue())
    assert line["turn_id"] == "turn-7" and "agent_id" not in line


def test_exceptions_are_one_json_field() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("now",), None)
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    data = json.loads(JsonFormatter().format(record))
    assert data["message"] == "failed now"
    assert "ValueError: boom" in data["exception"]
    assert "\n" not in JsonFormatter().format(record)


def test_the_log_format_comes_from_the_environment_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_RUNNER_LOG_FORMAT", "JSON")
    assert log_format() == "json"
    assert log_format("text") == "text"
    monkeypatch.setenv("AGENT_RUNNER_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError, match="AGENT_RUNNER_LOG_FORMAT='xml' is invalid: expected text or json"):
        log_format()
    with pytest.raises(SettingsError):
        WorkerSettings.from_env({"AGENT_RUNNER_LOG_FORMAT": "xml"})
    assert WorkerSettings.from_env({"AGENT_RUNNER_LOG_FORMAT": "json"}).log_format == "json"


def test_configure_logging_installs_on_the_root_and_named_loggers() -> None:
    root = logging.getLogger()
    server = logging.getLogger("test.server")
    root_handler, server_handler = logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())
    root.addHandler(root_handler)
    server.addHandler(server_handler)
    try:
        assert configure_logging("json", loggers=["test.server"]) == "json"
        assert isinstance(root_handler.formatter, JsonFormatter)
        assert isinstance(server_handler.formatter, JsonFormatter)
    finally:
        root.removeHandler(root_handler)
        server.removeHandler(server_handler)


def test_the_metrics_port_setting_is_checked() -> None:
    assert WorkerSettings.from_env({}).metrics_port is None
    settings = WorkerSettings.from_env({"AGENT_RUNNER_METRICS_PORT": "9464", "AGENT_RUNNER_METRICS_ADDR": "127.0.0.1"})
    assert (settings.metrics_port, settings.metrics_addr) == (9464, "127.0.0.1")
    for bad in ("0", "70000", "http"):
        with pytest.raises(SettingsError, match="AGENT_RUNNER_METRICS_PORT"):
            WorkerSettings.from_env({"AGENT_RUNNER_METRICS_PORT": bad})
