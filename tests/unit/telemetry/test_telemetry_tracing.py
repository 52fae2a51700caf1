"""Traces of turns in-process: GenAI spans, parent links and one trace per turn tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from agent_runner import (
    Agent,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentTurnStore,
    LeaseLostError,
    ScriptedChatModel,
)
from tests.unit.telemetry.telemetry_kit import MODEL_NAME, USAGE, Tracing, build_agent, drive, finish, new_runner, start
from workers.telemetry import instrument
from workers.telemetry.tracing import (
    begin_task,
    end_task,
    fallback_span_context,
    inject_headers,
    tracing_requested,
)

ROOT = Path(__file__).resolve().parents[3]


def attrs(span: ReadableSpan | None) -> Mapping[str, Any]:
    """A finished span's attributes (the SDK types them as optional)."""
    assert span is not None and span.attributes is not None
    return span.attributes


def _by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _parent(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    assert span.parent is not None, f"{span.name} has no parent"
    return _by_id(spans).get(span.parent.span_id)


def test_a_turn_with_a_form_an_approval_a_retry_and_a_child_is_one_trace_of_genai_spans() -> None:
    # Given an instrumented runner and a request span around the turn's creation
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)
    request_tracer = tracing.provider.get_tracer("test")

    # When the turn asks for a form, waits for an approval, retries a tool and runs a child,
    # with every resume coming later, outside the request
    with request_tracer.start_as_current_span("POST /v1/turns") as request:
        turn = start(runner, build_agent())
    finished = finish(runner, turn.id)
    assert finished.status is AgentTurnStatus.COMPLETED
    spans = tracing.spans()

    # Then every span belongs to the request's trace
    assert {s.context.trace_id for s in spans} == {request.get_span_context().trace_id}

    # And the turn's creation is a child of the request; every step of the turn a child of the creation
    (root_created,) = tracing.named("create_turn assistant")
    assert root_created.parent is not None
    assert root_created.parent.span_id == request.get_span_context().span_id
    assert turn.trace_context["traceparent"].split("-")[2] == format(root_created.context.span_id, "016x")
    root_steps = tracing.named("step assistant")
    assert len(root_steps) == finished.steps
    assert all(_parent(s, spans) is root_created for s in root_steps)

    # And the child turn was created by the parent's delegating step, and its steps hang below that
    (child_created,) = tracing.named("create_turn helper")
    delegating = _parent(child_created, spans)
    assert delegating is not None and attrs(delegating)["agent_runner.step.kind"] == "children"
    assert attrs(child_created)["agent_runner.turn.parent_id"] == turn.id
    child_steps = tracing.named("step helper")
    assert len(child_steps) == 3
    assert all(_parent(s, spans) is child_created for s in child_steps)

    # And model calls are `chat {model}` spans with the GenAI attributes, under their steps
    chats = tracing.named("chat ")
    assert len(chats) == 5 + 2
    root_chats = [c for c in chats if attrs(_parent(c, spans))["gen_ai.agent.id"] == "assistant"]
    assert {c.name for c in root_chats} == {f"chat {MODEL_NAME}"}
    for chat in root_chats:
        assert attrs(chat)["gen_ai.operation.name"] == "chat"
        assert attrs(chat)["gen_ai.request.model"] == MODEL_NAME
        assert attrs(chat)["gen_ai.usage.input_tokens"] == USAGE.input_tokens
        assert attrs(chat)["gen_ai.usage.output_tokens"] == USAGE.output_tokens
        step = _parent(chat, spans)
        assert step is not None and step.name == "step assistant"
        assert attrs(step)["agent_runner.step.kind"] == "model"

    # And tool calls are `execute_tool {name}` spans; the form tool is never executed
    tools = {(s.name, attrs(s)["gen_ai.tool.call.id"], s.status.status_code) for s in tracing.named("execute_tool")}
    assert tools == {
        ("execute_tool approved_write", "a1", StatusCode.UNSET),
        ("execute_tool flaky_write", "r1", StatusCode.ERROR),
        ("execute_tool flaky_write", "r1", StatusCode.UNSET),
        ("execute_tool add", "c1", StatusCode.UNSET),
    }
    for span in tracing.named("execute_tool"):
        assert attrs(span)["gen_ai.operation.name"] == "execute_tool"
        assert attrs(span)["gen_ai.tool.name"] == span.name.removeprefix("execute_tool ")

    # And the failed attempt carries its exception; its step left the turn waiting for the retry
    (failed,) = [s for s in tracing.named("execute_tool flaky_write") if s.status.status_code is StatusCode.ERROR]
    assert attrs(failed)["error.type"] == "RecoverableError"
    assert [e.name for e in failed.events] == ["exception"]
    retry_step = _parent(failed, spans)
    assert retry_step is not None and attrs(retry_step)["agent_runner.turn.status"] == "RETRY_SCHEDULED"
    assert any(e.name == "agent_runner.retry_scheduled" for e in retry_step.events)

    # And the steps tell what they did, with the turn's attributes
    kinds = [attrs(s)["agent_runner.step.kind"] for s in sorted(root_steps, key=lambda s: s.start_time or 0)]
    assert kinds == ["model", "suspend", "model", "suspend", "tool", "model", "tool", "tool", "model", "children"] + [
        "tool",
        "model",
    ]
    for step in root_steps:
        assert attrs(step)["agent_runner.turn.id"] == turn.id
        assert attrs(step)["agent_runner.turn.root_id"] == turn.id
        assert attrs(step)["gen_ai.agent.id"] == "assistant"
        assert isinstance(attrs(step)["agent_runner.turn.attempt"], int)
    assert attrs(root_steps[-1])["agent_runner.turn.status"] == "COMPLETED"


def test_a_turn_created_with_no_current_span_still_keeps_one_trace_for_all_its_steps() -> None:
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)

    # When a turn is created outside any span and resumed three times
    drive(runner, build_agent())

    # Then its creation starts a trace, and every later span continues it
    (created,) = tracing.named("create_turn assistant")
    assert created.parent is None
    assert {s.context.trace_id for s in tracing.spans()} == {created.context.trace_id}


def test_a_resume_in_another_trace_is_linked_and_the_turn_stays_in_its_own() -> None:
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)
    tracer = tracing.provider.get_tracer("test")
    turn = start(runner, build_agent())
    requests = {}

    @contextmanager
    def request(name: str) -> Iterator[None]:
        with tracer.start_as_current_span(f"POST resume {name}") as span:
            requests[name] = span
            yield

    # When each resume runs inside a request span of its own trace
    finish(runner, turn.id, around=request)

    # Then the steps stay in the turn's trace and link to the request that drove them
    (created,) = tracing.named("create_turn assistant")
    steps = tracing.named("step ")
    assert {s.context.trace_id for s in steps} == {created.context.trace_id}
    linked = {link.context.span_id for s in steps for link in s.links}
    assert linked == {span.get_span_context().span_id for span in requests.values()}
    for span in requests.values():
        assert span.get_span_context().trace_id != created.context.trace_id


def test_a_turn_stored_without_trace_context_gets_a_stable_trace_from_its_root_id() -> None:
    # Given a turn created by a runner without tracing, on a shared store
    store = InMemoryAgentTurnStore()
    agent = build_agent()
    plain = new_runner(turn_store=store)
    turn = start(plain, agent)
    assert turn.trace_context == {}

    # When an instrumented runner takes it over and runs the rest (its child included)
    tracing = Tracing()
    traced = new_runner(turn_store=store)
    instrument(traced, tracer_provider=tracing.provider, metrics=False)
    traced.agent_loader.register(agent)  # type: ignore[attr-defined]
    finish(traced, turn.id)

    # Then all its spans share the trace id derived from the root turn id
    expected = fallback_span_context(turn)
    assert {s.context.trace_id for s in tracing.spans()} == {expected.trace_id}
    root_steps = tracing.named("step assistant")
    assert {s.parent.span_id for s in root_steps if s.parent} == {expected.span_id}


def test_a_failing_model_call_marks_its_chat_span_and_step_as_errors() -> None:
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)
    agent = Agent(id="broken", chat_model=ScriptedChatModel([ValueError("bad request")]))

    turn = runner.run(agent, "hi")

    assert turn.status is AgentTurnStatus.FAILED
    (chat,) = tracing.named("chat ")
    assert chat.status.status_code is StatusCode.ERROR
    assert attrs(chat)["error.type"] == "ValueError"
    (step,) = tracing.named("step broken")
    assert step.status.status_code is StatusCode.ERROR
    assert attrs(step)["agent_runner.turn.status"] == "FAILED"
    assert [e.name for e in step.events if e.name == "exception"] == ["exception"]


def test_a_step_refused_by_the_lease_fence_is_an_error_span() -> None:
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)
    agent = Agent(id="plain", chat_model=ScriptedChatModel([AiMessage(content="hello")]))
    turn = runner.start(agent, "hi")
    # Another worker saved the turn under a newer lease meanwhile.
    runner.turn_store.save(turn.model_copy(update={"lease_fence": 5}), turn.version)
    stale = runner.turn_store.load(turn.id).model_copy(update={"lease_fence": 4})

    with pytest.raises(LeaseLostError):
        runner.step(stale)

    (step,) = tracing.named("step plain")
    assert step.status.status_code is StatusCode.ERROR
    assert attrs(step)["error.type"] == "LeaseLostError"
    assert attrs(step)["agent_runner.step.kind"] == "error"


def test_the_task_that_runs_a_step_links_to_the_span_that_enqueued_it() -> None:
    tracing = Tracing()
    runner = new_runner()
    instrument(runner, tracer_provider=tracing.provider, metrics=False)
    tracer = tracing.provider.get_tracer("test")
    agent = Agent(id="plain", chat_model=ScriptedChatModel([AiMessage(content="hello")]))
    turn = runner.start(agent, "hi")

    # Given the headers a publisher wrote from inside its span
    with tracer.start_as_current_span("publisher") as publisher:
        carrier: dict[str, str] = {}
        inject_headers(carrier)
    # When a task starts from them and steps the turn
    begin_task(carrier)
    try:
        runner.step(turn)
        # Then what the task enqueues after its step carries the step's context
        follow_up: dict[str, str] = {}
        inject_headers(follow_up)
    finally:
        end_task()

    (step,) = tracing.named("step plain")
    assert [link.context.span_id for link in step.links] == [publisher.get_span_context().span_id]
    assert follow_up["traceparent"].split("-")[2] == format(step.context.span_id, "016x")
    after: dict[str, str] = {}
    inject_headers(after)
    assert after == {}  # outside any task and span, nothing is propagated


def test_tracing_is_requested_only_by_the_otel_variables() -> None:
    assert not tracing_requested({})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"})


def _run_script(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_RUNNER_"))}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=full_env, timeout=120, check=False
    )


def test_the_otel_variables_configure_an_exporter_and_a_service_name() -> None:
    # Given a process told by the standard variables to print spans to the console
    code = """
import json, sys
from agent_runner import Agent, AgentRunner, AiMessage, ScriptedChatModel
from workers.telemetry import instrument
from workers.telemetry.tracing import flush_tracing
runner = AgentRunner()
instrument(runner, service_name="my-service")
turn = runner.run(Agent(id="plain", chat_model=ScriptedChatModel([AiMessage(content="hello")])), "hi")
flush_tracing()
print("STATUS", turn.status, json.dumps(turn.trace_context))
"""
    result = _run_script(code, {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "10"})

    # Then the spans were exported, under the service name given to instrument
    assert result.returncode == 0, result.stderr
    status_line = next(line for line in result.stdout.splitlines() if line.startswith("STATUS"))
    assert status_line.startswith("STATUS COMPLETED")
    assert "traceparent" in json.loads(status_line.split(" ", 2)[2])
    assert '"name": "step plain"' in result.stdout
    assert '"name": "chat ScriptedChatModel"' in result.stdout
    assert '"service.name": "my-service"' in result.stdout


def test_an_unknown_exporter_is_reported_and_the_turn_still_runs() -> None:
    code = """
from agent_runner import Agent, AgentRunner, AiMessage, ScriptedChatModel
from workers.telemetry import instrument
runner = AgentRunner()
instrument(runner)
print("STATUS", runner.run(Agent(id="plain", chat_model=ScriptedChatModel([AiMessage(content="hello")])), "hi").status)
"""
    result = _run_script(code, {"OTEL_TRACES_EXPORTER": "zipkin_thrift"})

    assert result.returncode == 0, result.stderr
    assert "STATUS COMPLETED" in result.stdout
    assert "no installed package provides the 'zipkin_thrift' span exporter" in result.stderr


def test_without_a_tracer_provider_nothing_is_recorded_and_nothing_breaks() -> None:
    # The API is installed but no SDK provider was set up: spans are no-ops.
    runner = new_runner()
    instrument(runner, metrics=False)
    turn = drive(runner, build_agent())
    assert turn.status is AgentTurnStatus.COMPLETED
    assert turn.trace_context == {}


_BLOCK_OPTIONAL = "import sys\nfor name in ('opentelemetry', 'prometheus_client'):\n    sys.modules[name] = None\n"


def test_without_the_optional_packages_instrument_runs_turns_and_reports_what_is_missing() -> None:
    # Given a process in which neither opentelemetry nor prometheus_client can be imported
    code = (
        _BLOCK_OPTIONAL
        + """
sys.path.insert(0, "tests/unit/telemetry")
import logging
from workers import telemetry
from workers.telemetry import TelemetryError, instrument, render_metrics, tracing_available, metrics_available
from agent_runner import AgentRunner
runner = AgentRunner()
instrument(runner)
logging.basicConfig(level=logging.INFO)
telemetry.configure_logging("json")
from tests.unit.telemetry.telemetry_kit import build_agent, drive, new_runner
runner = new_runner()
instrument(runner)
turn = drive(runner, build_agent(log=logging.getLogger("tool").info))
print("STATUS", turn.status, turn.trace_context, tracing_available(), metrics_available())
for call in (lambda: render_metrics(), lambda: instrument(AgentRunner(), tracing=True), lambda: instrument(AgentRunner(), metrics=True)):
    try:
        call()
    except TelemetryError as exc:
        print("REFUSED", exc)
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client") and sys.modules[m] is not None))
"""
    )
    result = _run_script(code, {})

    # Then turns run as usual, with the log context, and asking for the missing parts is a clear error
    assert result.returncode == 0, result.stderr
    assert "STATUS COMPLETED {} False False" in result.stdout
    assert result.stdout.count("REFUSED") == 3
    assert "pip install 'agent-runner[otel]'" in result.stdout
    assert "LOADED []" in result.stdout
    tool_line = next(line for line in result.stderr.splitlines() if "writing x" in line)
    assert json.loads(tool_line)["agent_id"] == "assistant"


def test_importing_the_core_and_the_telemetry_package_loads_no_optional_package() -> None:
    code = (
        "import sys, agent_runner, workers.telemetry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'prometheus_client')))"
    )
    result = _run_script(code, {})
    assert result.returncode == 0, result.stderr
    # workers.telemetry checks for the packages but imports them only when a runner is instrumented
    assert result.stdout.strip() == "[]"
