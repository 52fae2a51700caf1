"""OpenTelemetry traces of turns: a span per step, `chat {model}` and `execute_tool {name}` spans.

Import this module only when `opentelemetry-api` is installed (`workers.telemetry` checks).
Without the SDK, or without a configured tracer provider, every span here is the API's
no-op span and nothing is recorded.

One trace per turn tree, across processes, suspensions and resumes:

- When a turn is created, `TurnTracer.new_turn_context` starts and ends a `create_turn
  {agent}` span under whatever is current (an HTTP request span, a script's span, or for a
  child turn the parent's step span) and returns its W3C context, which the runner stores
  in the snapshot (`AgentTurn.trace_context`). A turn created with no current span starts a
  new trace there.
- Every step, in whichever process and however long after, is a child of that stored span.
  A turn created without a stored context (by a process without tracing) still gets one
  stable trace: its id is derived from the root turn id.
- Whatever triggered a step in another trace (a resume request, the step that enqueued it)
  is attached as a span link, so the cause stays one click away without breaking the tree.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agent_runner import AgentTurn, AgentTurnStatus

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("workers.telemetry")

TRACER_NAME = "agent_runner"
DEFAULT_SERVICE_NAME = "agent-runner"

# GenAI semantic-convention attribute names.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"

# This project's attributes.
TURN_ID = "agent_runner.turn.id"
ROOT_TURN_ID = "agent_runner.turn.root_id"
PARENT_TURN_ID = "agent_runner.turn.parent_id"
AGENT_VERSION = "agent_runner.agent.version"
TURN_ATTEMPT = "agent_runner.turn.attempt"
TURN_STATUS = "agent_runner.turn.status"
STEP_KIND = "agent_runner.step.kind"

_W3C = TraceContextTextMapPropagator()
_FALLBACK_FLAGS = TraceFlags(TraceFlags.SAMPLED)

_cause: ContextVar[SpanContext | None] = ContextVar("agent_runner_step_cause", default=None)
"""The span that enqueued the task being run (from the Celery headers), linked from its steps."""

_last_step: ContextVar[SpanContext | None] = ContextVar("agent_runner_last_step", default=None)
"""The last step span of the task being run: the cause of the follow-up it enqueues."""


def _version() -> str:
    try:
        return importlib.metadata.version("agent-runner")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def turn_attributes(turn: AgentTurn) -> dict[str, Any]:
    """The attributes naming a turn and its agent, shared by its spans."""
    attributes: dict[str, Any] = {
        GEN_AI_AGENT_ID: turn.agent_id,
        GEN_AI_AGENT_NAME: turn.agent_id,
        AGENT_VERSION: turn.agent_version,
        TURN_ID: turn.id,
        ROOT_TURN_ID: turn.root_turn_id,
    }
    if turn.parent_turn_id is not None:
        attributes[PARENT_TURN_ID] = turn.parent_turn_id
    if turn.conversation_id is not None:
        attributes[GEN_AI_CONVERSATION_ID] = turn.conversation_id
    return attributes


def fallback_span_context(turn: AgentTurn) -> SpanContext:
    """A stable remote parent for a turn that stored no trace context: same trace for the whole tree."""
    trace_digest = hashlib.sha256(f"agent-runner/trace/{turn.root_turn_id}".encode()).digest()
    span_digest = hashlib.sha256(f"agent-runner/turn/{turn.id}".encode()).digest()
    return SpanContext(
        trace_id=int.from_bytes(trace_digest[:16], "big") or 1,
        span_id=int.from_bytes(span_digest[:8], "big") or 1,
        is_remote=True,
        trace_flags=_FALLBACK_FLAGS,
    )


_parsed: dict[str, SpanContext] = {}
_PARSED_MAX = 4096


def stored_span_context(turn: AgentTurn) -> SpanContext:
    """The span context a turn's steps are children of: the stored one, else the derived fallback."""
    carrier = turn.trace_context
    traceparent = carrier.get("traceparent")
    if traceparent:
        # A turn takes many steps, often in the same process: parse its context once.
        span_context = _parsed.get(traceparent)
        if span_context is None:
            span_context = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
            if len(_parsed) >= _PARSED_MAX:
                _parsed.clear()
            _parsed[traceparent] = span_context
        if span_context.is_valid:
            return span_context
    return fallback_span_context(turn)


class TurnTracer:
    """Starts the spans of turns, steps, model calls and tool calls.

    Args:
        tracer_provider: Where spans go (default: the global provider, a no-op until an SDK
            provider is installed).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(TRACER_NAME, _version(), tracer_provider=tracer_provider)
        self._explicit = tracer_provider is not None

    def recording(self) -> bool:
        """Whether spans can be recorded: a provider was given, or the global one is no longer the API's no-op.

        Checked on every step (the application may install its provider after `instrument`),
        so that an unconfigured process pays next to nothing for spans nobody records.
        """
        if self._explicit:
            return True
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    def new_turn_context(self, turn: AgentTurn) -> dict[str, str]:
        """Record the creation of `turn` under the current context and return the context to store with it."""
        if not self.recording():
            return {}
        span = self.tracer.start_span(
            f"create_turn {turn.agent_id}", kind=SpanKind.INTERNAL, attributes=turn_attributes(turn)
        )
        span.end()
        if not span.get_span_context().is_valid:
            return {}  # no SDK: there is no trace to continue
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def start_step(self, turn: AgentTurn) -> Span:
        """Start the span of one step of `turn` (not made current; see `use_span`)."""
        parent = stored_span_context(turn)
        # Few attributes on purpose: the SDK checks each one, on every step. The turn's
        # creation span carries the rest (agent version, parent, conversation).
        attributes: dict[str, Any] = {
            GEN_AI_AGENT_ID: turn.agent_id,
            TURN_ID: turn.id,
            ROOT_TURN_ID: turn.root_turn_id,
            TURN_ATTEMPT: turn.attempt,
        }
        return self.tracer.start_span(
            f"step {turn.agent_id}",
            context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=_links(parent),
        )

    def start_model(self, model: str) -> Span:
        """Start a `chat {model}` span for one model call (a child of the current step's span, which names the turn)."""
        return self.tracer.start_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={GEN_AI_OPERATION_NAME: "chat", GEN_AI_REQUEST_MODEL: model},
        )

    def start_tool(self, name: str, call_id: str) -> Span:
        """Start an `execute_tool {name}` span for one tool call."""
        return self.tracer.start_span(
            f"execute_tool {name}",
            kind=SpanKind.INTERNAL,
            attributes={GEN_AI_OPERATION_NAME: "execute_tool", GEN_AI_TOOL_NAME: name, GEN_AI_TOOL_CALL_ID: call_id},
        )

    @staticmethod
    def activate(span: Span) -> Token[Context]:
        """Make `span` current; returns the token for `deactivate`."""
        return otel_context.attach(trace.set_span_in_context(span))

    @staticmethod
    def deactivate(token: Token[Context]) -> None:
        """Restore the context from before `activate`."""
        otel_context.detach(token)

    @staticmethod
    @contextmanager
    def call_span(span: Span, not_failures: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """Run the block with the model or tool call's `span` current, and end the span after it.

        An exception leaving the block marks the span failed, unless it is one of
        `not_failures` (an outcome the caller records in its own way).
        """
        token = TurnTracer.activate(span)
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, not_failures):
                TurnTracer.mark_failed(span, exc)
            raise
        finally:
            TurnTracer.deactivate(token)
            span.end()

    @staticmethod
    def end_step(span: Span, turn: AgentTurn, kind: str, error: BaseException | None) -> None:
        """Describe how the step left the turn, mark a failed turn as an error, and end the span."""
        if span.is_recording():
            span.set_attributes({STEP_KIND: kind, TURN_STATUS: turn.status.value})
            if turn.status is AgentTurnStatus.RETRY_SCHEDULED and turn.next_retry_at is not None:
                span.add_event(
                    "agent_runner.retry_scheduled",
                    {TURN_ATTEMPT: turn.attempt, "agent_runner.turn.next_retry_at": turn.next_retry_at.isoformat()},
                )
            if turn.status is AgentTurnStatus.FAILED:
                if error is not None:
                    span.record_exception(error)
                    span.set_attribute(ERROR_TYPE, type(error).__qualname__)
                span.set_status(Status(StatusCode.ERROR, turn.error or "the turn failed"))
        span.end()
        context = span.get_span_context()
        if context.is_valid:
            _last_step.set(context)

    @staticmethod
    def fail_step(span: Span, error: BaseException) -> None:
        """Mark the step as failed by `error` (it raised out of the runner) and end the span."""
        TurnTracer.mark_failed(span, error)
        if span.is_recording():
            span.set_attribute(STEP_KIND, "error")
        span.end()

    @staticmethod
    def mark_failed(span: Span, error: BaseException) -> None:
        """Record `error` on `span` and set its status to ERROR."""
        if not span.is_recording():
            return
        span.record_exception(error)
        span.set_attribute(ERROR_TYPE, type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    @staticmethod
    def record_usage(span: Span, response: object) -> None:
        """Put a model response's token counts on its span."""
        usage = getattr(response, "usage", None)
        if usage is not None and span.is_recording():
            span.set_attributes(
                {
                    GEN_AI_USAGE_INPUT_TOKENS: int(usage.input_tokens),
                    GEN_AI_USAGE_OUTPUT_TOKENS: int(usage.output_tokens),
                }
            )

    @staticmethod
    def add_event(span: Span, name: str, attributes: Mapping[str, Any]) -> None:
        """Add an event to `span` if it records."""
        if span.is_recording():
            span.add_event(name, dict(attributes))


def _links(parent: SpanContext) -> Sequence[Link]:
    """Links to what caused this step, when that is not the parent itself."""
    links: list[Link] = []
    seen = {parent.span_id}
    cause = _cause.get()
    if cause is not None and cause.is_valid and cause.span_id not in seen:
        links.append(Link(cause, {"agent_runner.link": "enqueued_by"}))
        seen.add(cause.span_id)
    # Stepping in the thread of a request or script of another trace (a resume in-process).
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id != parent.trace_id and current.span_id not in seen:
        links.append(Link(current, {"agent_runner.link": "driven_by"}))
    return links


# --- Celery messages ----------------------------------------------------------------------------


def inject_headers(carrier: dict[str, str]) -> None:
    """Write the context of the current step (or the task's last step) into `carrier`."""
    current = trace.get_current_span().get_span_context()
    if current.is_valid:
        propagate.inject(carrier)
        return
    last = _last_step.get()
    if last is not None:
        propagate.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(last)))


def begin_task(carrier: Mapping[str, str] | None) -> None:
    """Remember the span that enqueued the task being run, for the links of its steps."""
    _last_step.set(None)
    if not carrier:
        _cause.set(None)
        return
    span_context = trace.get_current_span(propagate.extract(dict(carrier))).get_span_context()
    _cause.set(span_context if span_context.is_valid else None)


def end_task() -> None:
    """Forget the task's cause and last step."""
    _cause.set(None)
    _last_step.set(None)


# --- SDK configuration from OTEL_* ---------------------------------------------------------------

_configured_provider: SdkTracerProvider | None = None
_default_service_name = DEFAULT_SERVICE_NAME


def set_default_service_name(name: str) -> None:
    """The `service.name` used when this process configures tracing and OTEL_SERVICE_NAME is unset."""
    global _default_service_name
    _default_service_name = name


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* variables ask this process to export traces.

    Yes when OTEL_TRACES_EXPORTER names an exporter other than `none`, or an OTLP endpoint is
    set; never when OTEL_SDK_DISABLED is true.
    """
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    exporters = [name.strip() for name in (env.get("OTEL_TRACES_EXPORTER") or "").split(",") if name.strip()]
    if exporters:
        return any(name != "none" for name in exporters)
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure_tracing(service_name: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Install an SDK tracer provider configured from the OTEL_* variables, once per process.

    Nothing is installed when the SDK is missing, when the environment does not ask for
    traces (`tracing_requested`), or when the application already installed a provider of
    its own (that one is used as it is). Exporters come from OTEL_TRACES_EXPORTER
    (default `otlp` once an OTLP endpoint is set): `otlp` picks the exporter for
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL (default
    `http/protobuf`); any other name is looked up among the installed
    `opentelemetry_traces_exporter` entry points (`console`, ...). Spans are batched
    (OTEL_BSP_*), sampled by OTEL_TRACES_SAMPLER, and described by OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES.

    An exporter that cannot be loaded is logged and skipped: telemetry never stops a worker.

    Returns:
        True when this call installed a provider.
    """
    global _configured_provider
    env = os.environ if environ is None else environ
    if _configured_provider is not None or not tracing_requested(env):
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.info("OTEL_* variables ask for traces but opentelemetry-sdk is not installed; tracing stays off")
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application configured tracing itself
    exporters = _load_exporters(env)
    if not exporters:
        return False
    resource = Resource.create({})
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in (env.get("OTEL_RESOURCE_ATTRIBUTES") or ""):
        resource = resource.merge(Resource({SERVICE_NAME: service_name or _default_service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured_provider = provider
    return True


def _load_exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    names = [name.strip() for name in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if name.strip()]
    exporters: list[SpanExporter] = []
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group="opentelemetry_traces_exporter")}
    for name in names:
        if name == "none":
            continue
        entry_name = name
        if name == "otlp":
            protocol = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            entry_name = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}.get(protocol, "")
            if not entry_name:
                logger.error("OTEL_EXPORTER_OTLP_PROTOCOL=%r is not supported (use http/protobuf or grpc)", protocol)
                continue
        entry_point = entry_points.get(entry_name)
        if entry_point is None:
            logger.error(
                "OTEL_TRACES_EXPORTER names %r, but no installed package provides the %r span exporter",
                name,
                entry_name,
            )
            continue
        try:
            exporters.append(entry_point.load()())
        except Exception:
            logger.exception("could not create the %r span exporter; its spans are dropped", name)
    return exporters


def flush_tracing(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered by the provider this process configured (before it exits)."""
    provider = _configured_provider
    if provider is not None:
        try:
            provider.force_flush(int(timeout_s * 1000))
        except Exception:
            logger.exception("flushing spans failed")
