"""The runner-side instrumentation: one middleware around steps, model and tool calls, one event listener."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentFormRequiredException,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    LeaseLostError,
    Middleware,
    ToolCall,
    VersionConflictError,
)
from agent_runner.models import ChatRequest, ChatResponse
from agent_runner.runner import AgentStepResult
from agent_runner.telemetry_hooks import enter_step, exit_step
from workers.telemetry import metrics

if TYPE_CHECKING:
    from workers.telemetry.tracing import TurnTracer

_SUSPENDED = frozenset({AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_APPROVAL})
_MAX_MODEL_NAMES = 256


@dataclass
class _StepState:
    turn: AgentTurn
    tracer: TurnTracer | None
    """The tracer when this step is traced (its model and tool calls then are too)."""
    kind: str | None = None


_step_state: ContextVar[_StepState | None] = ContextVar("agent_runner_telemetry_step", default=None)


def _note_call(kind: str) -> tuple[TurnTracer, AgentTurn] | None:
    """Record that the current step made a `kind` call; its tracer and turn when the step is traced."""
    state = _step_state.get()
    if state is None:
        return None
    state.kind = kind
    if state.tracer is None:
        return None
    return state.tracer, state.turn


def step_kind(before: AgentTurn, result: AgentStepResult, called: str | None) -> str:
    """What a step did, for the `kind` label: the call it made, else what changed in the turn."""
    if called is not None:
        return called
    after = result.turn
    if isinstance(result.error, VersionConflictError):
        return "conflict"
    if result.tool_messages:
        return "tool"
    if after.version == before.version:
        return "noop"
    if len(after.children) > len(before.children):
        return "children"
    if after.status in _SUSPENDED:
        return "suspend"
    if after.is_terminal:
        return "terminal"
    return "noop"


class TelemetryMiddleware(Middleware):
    """Spans, metrics and the log context of every step, model call and tool call of a runner.

    Register it outermost (`instrument` does), so that step spans and durations include
    every other middleware. Steps of turns that are not runnable (the runner returns them
    unchanged) are passed through untouched.

    Args:
        runner: The runner it is registered on (for the clock and the agents' model names).
        tracer: Starts the spans, or None for no tracing.
        record_metrics: Whether to record Prometheus metrics.
    """

    def __init__(self, runner: AgentRunner, tracer: TurnTracer | None, record_metrics: bool) -> None:
        self.runner = runner
        self.tracer = tracer
        self.record_metrics = record_metrics
        self._model_names: dict[tuple[str, str], str] = {}

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        """Run the step inside its span and step context; count it and time it."""
        if not turn.is_runnable(self.runner.clock()):
            return call_next(turn)
        # Written out rather than with context managers: this runs on every step.
        tracer = self.tracer if self.tracer is not None and self.tracer.recording() else None
        state = _StepState(turn, tracer)
        state_token = _step_state.set(state)
        step_token = enter_step(turn)
        span = tracer.start_step(turn) if tracer is not None else None
        span_token = tracer.activate(span) if tracer is not None and span is not None else None
        started = time.perf_counter()
        kind = "error"
        try:
            result = call_next(turn)
            kind = step_kind(turn, result, state.kind)
        except BaseException as exc:
            if isinstance(exc, LeaseLostError) and self.record_metrics:
                metrics.record_lease_takeover()
            if tracer is not None and span is not None and span_token is not None:
                tracer.deactivate(span_token)
                span_token = None
                tracer.fail_step(span, exc)
            raise
        finally:
            if tracer is not None and span_token is not None:
                tracer.deactivate(span_token)
            exit_step(step_token)
            _step_state.reset(state_token)
            if self.record_metrics:
                metrics.record_step(turn.agent_id, kind, time.perf_counter() - started)
        if tracer is not None and span is not None:
            tracer.end_step(span, result.turn, kind, result.error)
        return result

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        """Run the model call inside a `chat {model}` span with the GenAI attributes."""
        traced = _note_call("model")
        if traced is None:
            return call_next(request)
        tracer, turn = traced
        span = tracer.start_model(self._model_name(turn))
        with tracer.call_span(span):
            response = call_next(request)
            tracer.record_usage(span, response)
            return response

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        """Run the tool call inside an `execute_tool {name}` span with the GenAI attributes."""
        traced = _note_call("tool")
        if traced is None:
            return call_next(tool_call)
        tracer, _ = traced
        span = tracer.start_tool(tool_call.name, tool_call.id)
        # A form request is not a failure: the tool asks a person for data and runs again afterwards.
        with tracer.call_span(span, not_failures=(AgentFormRequiredException,)):
            try:
                return call_next(tool_call)
            except AgentFormRequiredException as exc:
                tracer.add_event(span, "agent_runner.form_required", {"agent_runner.form.key": exc.form.key})
                raise

    def _model_name(self, turn: AgentTurn | None) -> str:
        if turn is None:
            return "unknown"
        key = (turn.agent_id, turn.agent_version)
        name = self._model_names.get(key)
        if name is None:
            try:
                model = self.runner.agent_for(turn).chat_model
            except Exception:
                model = None
            declared = getattr(model, "model", None)
            name = declared if isinstance(declared, str) and declared else type(model).__name__
            if len(self._model_names) < _MAX_MODEL_NAMES:
                self._model_names[key] = name
        return name


class MetricsListener:
    """Counts ended turns, scheduled retries and accepted resumes, wherever the runner emits them.

    Only registered with metrics on: a runner with a listener builds an event object for
    everything it emits, which tracing alone does not need.
    """

    def __call__(self, event: AgentEvent) -> None:
        """Count `event`."""
        kind = event.type
        if kind.is_terminal:
            metrics.record_turn_ended(str(event.data.get("status")))
        elif kind is AgentEventType.RETRY_SCHEDULED:
            limit_key = event.data.get("limit_key")
            if limit_key is None:
                metrics.record_retry_scheduled()
            else:
                metrics.record_model_limit_wait(str(limit_key), str(event.data.get("limit_reason")))
        elif kind is AgentEventType.TURN_RESUMED:
            metrics.record_resume(metrics.resume_action_of_event(event.data), "accepted")
