"""The Celery signal handlers, called as Celery calls them, on the real tasks of the app (no broker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent_runner import (
    Agent,
    AgentRunner,
    AgentStepResult,
    AgentTurn,
    AiMessage,
    InMemoryAgentTurnStore,
    InMemoryTurnLease,
    Lease,
    LeaseKeeper,
    Middleware,
    ScriptedChatModel,
)
from agent_runner.telemetry_hooks import current_step
from tests.unit.telemetry.telemetry_kit import Tracing
from workers.app import app, settings  # the app of `celery -A workers.app`, its tasks registered
from workers.celery_app.dispatch import CeleryDispatcher
from workers.celery_app.tasks import deliver_step_turn
from workers.settings import WorkerSettings
from workers.telemetry import celery_signals, logs
from workers.telemetry.celery_signals import ENQUEUED_AT_HEADER, SWEEP_TASKS, TRACE_HEADER, CeleryTelemetry
from workers.wiring import ProcessBackends


@pytest.fixture
def telemetry() -> CeleryTelemetry:
    return CeleryTelemetry(app, settings)


@pytest.fixture
def step_task(telemetry: CeleryTelemetry) -> Iterator[Any]:
    task = telemetry.app.tasks["agent_runner.step_turn"]
    yield task
    while task.request_stack.top is not None:
        task.pop_request()


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_publishing_an_agent_runner_task_stamps_the_enqueue_time_and_the_trace() -> None:
    tracer = Tracing().provider.get_tracer("test")
    headers: dict[str, Any] = {"task": "agent_runner.step_turn"}
    other: dict[str, Any] = {"task": "billing.charge"}
    before = time.time()

    with tracer.start_as_current_span("POST /v1/turns/t-1/resume") as request:
        celery_signals.stamp_message(sender="agent_runner.step_turn", headers=headers)
        celery_signals.stamp_message(sender="billing.charge", headers=other)

    assert before <= headers[ENQUEUED_AT_HEADER] <= time.time()
    traceparent = headers[TRACE_HEADER]["traceparent"]
    assert traceparent.split("-")[2] == format(request.get_span_context().span_id, "016x")
    assert other == {"task": "billing.charge"}  # other apps' tasks are left alone


def test_any_app_that_sends_tasks_stamps_its_messages() -> None:
    # A web process only builds a sending app; the worker's telemetry is not installed there.
    from celery import signals

    from workers.celery_app.config import create_app

    signals.before_task_publish.disconnect(dispatch_uid="agent_runner.stamp_message")
    unstamped: dict[str, Any] = {}
    signals.before_task_publish.send(sender="agent_runner.step_turn", headers=unstamped)
    assert unstamped == {}

    create_app(WorkerSettings.from_env({"AGENT_RUNNER_BROKER_URL": "memory://"}))
    stamped: dict[str, Any] = {}
    signals.before_task_publish.send(sender="agent_runner.step_turn", headers=stamped)
    assert ENQUEUED_AT_HEADER in stamped


def test_a_step_task_observes_its_queue_delay_from_the_later_of_enqueue_and_eta(
    telemetry: CeleryTelemetry, step_task: Any
) -> None:
    count, total = _sample("agent_runner_queue_delay_seconds_count"), _sample("agent_runner_queue_delay_seconds_sum")
    now = time.time()
    eta = datetime.fromtimestamp(now - 1.0, UTC).isoformat()

    # Enqueued 3 s ago without ETA; enqueued 10 s ago with an ETA 1 s ago
    for headers in ({ENQUEUED_AT_HEADER: now - 3.0}, {ENQUEUED_AT_HEADER: now - 10.0, "eta": eta}):
        step_task.push_request(**headers)
        telemetry.on_task_prerun(task=step_task, args=["turn-1", 3])
        telemetry.on_task_postrun(task=step_task, retval="stepped")
        step_task.pop_request()

    assert _sample("agent_runner_queue_delay_seconds_count") - count == 2
    observed = _sample("agent_runner_queue_delay_seconds_sum") - total
    assert 4.0 <= observed < 4.0 + 2 * (time.time() - now) + 0.5


def test_a_step_task_names_its_turn_for_the_logs_until_it_ends(telemetry: CeleryTelemetry, step_task: Any) -> None:
    step_task.push_request()
    telemetry.on_task_prerun(task=step_task, args=["turn-9", 0])
    during = logs.StepContextFilter()
    record = _record()
    during.filter(record)
    telemetry.on_task_postrun(task=step_task, retval="stepped")
    after = _record()
    logs.StepContextFilter().filter(after)

    assert record.turn_id == "turn-9"
    assert after.turn_id is None
    assert current_step() is None


def _record() -> Any:
    import logging

    return logging.LogRecord("workers.tasks", logging.INFO, __file__, 1, "msg", (), None)


@pytest.mark.parametrize(("task_name", "sweep"), sorted(SWEEP_TASKS.items()))
def test_sweeps_count_their_runs_and_what_they_re_enqueued(
    telemetry: CeleryTelemetry, task_name: str, sweep: str
) -> None:
    task = telemetry.app.tasks[task_name]
    runs, items = (
        _sample("agent_runner_sweeps_total", sweep=sweep),
        _sample("agent_runner_sweep_enqueued_total", sweep=sweep),
    )

    telemetry.on_task_postrun(task=task, retval=4)
    telemetry.on_task_postrun(task=task, retval=0)

    assert _sample("agent_runner_sweeps_total", sweep=sweep) - runs == 2
    assert _sample("agent_runner_sweep_enqueued_total", sweep=sweep) - items == 4


def test_an_eta_header_is_read_in_either_form() -> None:
    from workers.telemetry.celery_signals import _timestamp

    moment = datetime(2030, 1, 1, tzinfo=UTC)
    assert _timestamp(moment) == moment.timestamp()
    assert _timestamp((moment + timedelta(seconds=1)).isoformat()) == moment.timestamp() + 1
    assert _timestamp("not a date") is None
    assert _timestamp(None) is None


class RefusedRenewals(InMemoryTurnLease):
    """A lease backend that refuses every renewal, as when another worker has taken the lease over."""

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        return False


class SlowStep(Middleware):
    """Makes each step outlast a few lease heartbeats."""

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        time.sleep(0.1)
        return call_next(turn)


def test_a_task_that_finds_its_lease_taken_over_counts_a_takeover_and_stops() -> None:
    # Given a step task whose lease renewals are refused while its first step runs
    settings = WorkerSettings.from_env({"AGENT_RUNNER_QUEUE": "q", "AGENT_RUNNER_STEPS_PER_TASK": "4"})
    store = InMemoryAgentTurnStore()
    runner = AgentRunner(turn_store=store, middleware=[SlowStep()])
    agent = Agent(id="looker", chat_model=ScriptedChatModel([AiMessage(content="done")] * 3))
    turn = runner.start(agent, "hi")
    wiring = ProcessBackends(
        settings=settings,
        celery_app=None,
        runner=runner,
        turn_store=store,  # type: ignore[arg-type]
        inbox=None,  # type: ignore[arg-type]
        lease=None,  # type: ignore[arg-type]
        guard=None,  # type: ignore[arg-type]
        dispatcher=CeleryDispatcher(None, settings),
        keeper=LeaseKeeper(RefusedRenewals(), ttl_ms=30),
        live=None,  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
    )
    before = _sample("agent_runner_lease_takeovers_total")

    # When the task runs
    deliver_step_turn(wiring, turn.id, turn.version)

    # Then it stopped at the next boundary and counted one takeover
    assert _sample("agent_runner_lease_takeovers_total") - before == 1
