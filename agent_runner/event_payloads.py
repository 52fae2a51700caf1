"""The typed `data` of every event type, and the one function that builds each.

An `AgentEvent.data` is a JSON object: the turn's `status` and `version` after the save
that caused the event, then the fields of its type. Each type has one payload model here
(`PAYLOAD_MODELS`) and one constructor function; every place that emits an event builds
its fields through that function, so a type has one shape wherever it comes from. Fields
that only some occurrences have are present and null on the others.

`AgentEvent.data` stays a plain dict on the wire and in Python; validate it with
`payload_of(event)` to get the typed model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, NamedTuple, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from typing_extensions import TypeAliasType

from agent_runner.events import AgentEvent, AgentEventType
from agent_runner.forms import AgentFormDefinition
from agent_runner.ids import queued_turn_id
from agent_runner.messages import ToolCall
from agent_runner.model_limits import LimitReason
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import AgentSuspension, ResumeType, SuspensionType, TimeoutAction

_NestedArray = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "type": "array",
            "items": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
            "description": "An array inside an array: any JSON is accepted; the schema shows the common case.",
        }
    ),
]
# Arrays of arrays are described without recursion: TypeScript cannot express a union that
# holds an array of itself through the indexed types generated clients use.

JsonElement = TypeAliasType(
    "JsonElement",
    "Union[str, int, float, bool, None, dict[str, JsonValue], _NestedArray]",  # noqa: UP007
)
"""An item of a JSON array."""

JsonValue = TypeAliasType(
    "JsonValue",
    "Union[str, int, float, bool, None, list[JsonElement], dict[str, JsonValue]]",  # noqa: UP007
)
"""Any JSON value (typed, so that schemas name it instead of leaving it open)."""

JsonObject = dict[str, JsonValue]

SuspensionKind = Literal["approval", "outcome_unknown"]

SUSPENSION_KIND_DESCRIPTION = (
    "`approval` for TOOL_APPROVAL (the call waits to run: approve or reject it); `outcome_unknown` for "
    "TOOL_OUTCOME_UNKNOWN (the call started and its outcome was never recorded: approve to run it again, "
    "`tool_result` to mark it done, reject to fail it; events written before that type existed have "
    "TOOL_APPROVAL with this kind). Null for the other suspensions."
)
"""What `kind` says wherever a suspension is shown (events, the turn view): one text for both."""
"""`kind` of a suspension about a tool call: TOOL_APPROVAL's `approval` (the call waits to run) or
TOOL_OUTCOME_UNKNOWN's `outcome_unknown` (it started and its outcome is unknown)."""


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EventStamp(_Payload):
    """The fields every event's `data` starts with."""

    status: AgentTurnStatus = Field(description="The turn's status after the save that caused the event.")
    version: int = Field(description="The turn's version after that save (0 when the turn was created).")


# --- Fields of each event type ------------------------------------------------------------------


class TurnStartedFields(_Payload):
    """Fields of TURN_STARTED."""

    agent_id: str
    agent_version: str
    parent_turn_id: str | None = Field(description="The parent of a child turn; null for a root turn.")
    message_id: str = Field(
        description="The user message the turn starts from (for a queued message: the `message_id` it was queued with)."
    )
    queued_message_id: str | None = Field(
        default=None,
        description=(
            "The queued message the turn was started from (its MESSAGE_QUEUED event names this turn); "
            "null for a turn started directly."
        ),
    )
    starts_at: datetime | None = Field(
        default=None, description="When a delayed start lets the turn run; null for a turn that may run at once."
    )


class TurnRunningFields(_Payload):
    """Fields of TURN_RUNNING (none)."""


class FormFields(_Payload):
    """A form to fill in."""

    key: str
    description: str
    schema_: JsonObject = Field(alias="schema", description="The JSON Schema frozen into the suspension.")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)


class ToolCallFields(_Payload):
    """A tool call, as it may be shown."""

    id: str
    name: str
    arguments: JsonObject = Field(description="Arguments the tool marks sensitive are `***`.")


class TurnSuspendedFields(_Payload):
    """Fields of TURN_SUSPENDED."""

    suspension_type: SuspensionType
    kind: SuspensionKind | None = Field(description=SUSPENSION_KIND_DESCRIPTION)
    correlation_id: str | None = Field(description="The tool call a resume names; null for a plain question.")
    message: str
    form_key: str | None = Field(description="The form's key, for a form (also in `form`).")
    form: FormFields | None = Field(description="The form to fill in, with its frozen schema.")
    tool_call: ToolCallFields | None = Field(description="The call to approve, or whose outcome is unknown.")
    deadline: str | None = Field(description="When `on_timeout` applies (ISO 8601); null without a deadline.")
    on_timeout: TimeoutAction | None = Field(description="`approve`, `reject` or `submit`; null without a deadline.")


class TurnResumedFields(_Payload):
    """Fields of TURN_RESUMED."""

    command: ResumeType | None = Field(
        description="The resume command type (`AgentResumeCommand.type`); null when a scheduled retry came due."
    )
    tool_call_id: str | None = Field(description="The call the command decided on.")
    child_turn_id: str | None = Field(description="The child whose end resumed the parent, for CHILD_COMPLETED.")
    reason: str | None = Field(description="The command's reason, or `retry due` for a scheduled retry.")
    attempt: int | None = Field(description="The attempt about to run, when a scheduled retry came due.")
    metadata: JsonObject = Field(description="The command's metadata (who decided).")


class RetryScheduledFields(_Payload):
    """Fields of RETRY_SCHEDULED."""

    attempt: int
    next_retry_at: str | None = Field(description="ISO 8601.")
    error: str = Field(description="The error that is retried, or why the call waits for a model limit.")
    limit_key: str | None = Field(
        default=None, description="The shared model limit the call waits for (None: a retry after a failure)."
    )
    limit_reason: LimitReason | None = Field(default=None, description="Why the call waits for the model limit.")


class ModelDeltaFields(_Payload):
    """Fields of MODEL_DELTA."""

    delta: str
    lease_fence: int | None = Field(description="Tells the deltas of an abandoned model call from those of its re-run.")


class ModelResponseFields(_Payload):
    """Fields of MODEL_RESPONSE."""

    message_id: str
    content: str | None = Field(description="The whole text of the answer (clients that missed deltas resync).")
    tool_calls: list[str] = Field(description="The names of the tools the model called.")
    input_tokens: int
    output_tokens: int
    model: str | None = Field(
        default=None,
        exclude_if=lambda model: model is None,
        description="The model that answered, when a `FallbackChatModel` chose among several.",
    )


class ToolStartedFields(_Payload):
    """Fields of TOOL_STARTED."""

    tool_call_id: str
    tool_name: str


class ToolProgressFields(_Payload):
    """Fields of TOOL_PROGRESS."""

    tool_call_id: str
    tool_name: str
    progress: JsonValue = Field(description="What the tool reported.")


class ToolCompletedFields(_Payload):
    """Fields of TOOL_COMPLETED."""

    tool_call_id: str
    tool_name: str
    is_error: bool
    reconciled: bool = Field(description="The result was found by reconciling a call whose outcome was unknown.")


class TurnEndedFields(_Payload):
    """Fields of the terminal events."""

    error: str | None
    final_output: str | None


class ChatMemoryErrorFields(_Payload):
    """Fields of CHAT_MEMORY_ERROR."""

    error: str


class DeadlineApproachingFields(_Payload):
    """Fields of DEADLINE_APPROACHING."""

    correlation_id: str | None
    suspension_type: SuspensionType
    deadline: str = Field(description="ISO 8601.")
    on_timeout: TimeoutAction | None


class TurnQueuedFields(_Payload):
    """Fields of TURN_QUEUED."""

    place: int = Field(description="The turn's place in its tenant's line when it was lined up (1: next).")
    tenant_waiting: int = Field(description="New turns of its tenant waiting for admission then, itself included.")


class TurnRecoveringFields(_Payload):
    """Fields of TURN_RECOVERING."""

    recoveries: int = Field(ge=1, description="Takeovers in a row without progress, this one included.")
    max_recoveries: int = Field(
        ge=1, description="The policy's bound: one more takeover without progress ends the turn."
    )


class SteeringAcceptedFields(_Payload):
    """Fields of STEERING_ACCEPTED."""

    message_id: str
    text: str


class SteeringAppliedFields(_Payload):
    """Fields of STEERING_APPLIED."""

    message_ids: list[str] = Field(description="The steering messages that joined the history, in order.")


class SteeringNotAppliedFields(_Payload):
    """Fields of STEERING_NOT_APPLIED."""

    message_ids: list[str] = Field(description="The steering messages the turn ended without, in order.")
    reason: str
    next_turn_id: str | None = Field(
        description="The conversation's turn that took them (a new turn or the active one); null when none did."
    )


# --- Message events: a queued message has no turn yet, so no stamp -------------------------------


class MessageQueuedPayload(_Payload):
    """MESSAGE_QUEUED: a user message waits behind a busy conversation; its turn starts when the conversation is free.

    The event's `turn_id` is the id that turn will have; its TURN_STARTED carries
    `queued_message_id` equal to `message_id`.
    """

    message_id: str
    sequence: int = Field(description="The message's place in its conversation's queue (1, 2, ...; gaps are possible).")
    ahead: int = Field(description="Messages of the conversation queued before it that had not started yet.")
    content: str
    agent_id: str | None = Field(description="The agent that answers it; null: the deployment's inbox agent.")


class MessageFailedPayload(_Payload):
    """MESSAGE_FAILED: a queued message was given up on; no turn starts from it."""

    message_id: str
    error: str


# --- Whole payloads (stamp + fields), as read from `AgentEvent.data` -----------------------------


class TurnStartedPayload(EventStamp, TurnStartedFields):
    """TURN_STARTED: a turn was created (READY)."""


class TurnQueuedPayload(EventStamp, TurnQueuedFields):
    """TURN_QUEUED: a new turn waits for fair admission between tenants (live only)."""


class TurnRecoveringPayload(EventStamp, TurnRecoveringFields):
    """TURN_RECOVERING: a worker took the turn over from one that died without saving anything."""


class SteeringAcceptedPayload(EventStamp, SteeringAcceptedFields):
    """STEERING_ACCEPTED: a steering message was stored for the turn (live only)."""


class SteeringAppliedPayload(EventStamp, SteeringAppliedFields):
    """STEERING_APPLIED: steering messages joined the turn's history before a model call."""


class SteeringNotAppliedPayload(EventStamp, SteeringNotAppliedFields):
    """STEERING_NOT_APPLIED: the turn ended before applying steering messages (live only)."""


class TurnRunningPayload(EventStamp, TurnRunningFields):
    """TURN_RUNNING: a runner took the READY turn and steps it."""


class TurnSuspendedPayload(EventStamp, TurnSuspendedFields):
    """TURN_SUSPENDED: the turn waits; everything a page needs to show the question, form or call."""


class TurnResumedPayload(EventStamp, TurnResumedFields):
    """TURN_RESUMED: a command was applied, a child ended, or a scheduled retry came due."""


class RetryScheduledPayload(EventStamp, RetryScheduledFields):
    """RETRY_SCHEDULED: a transient error; the turn runs again at `next_retry_at`."""


class ModelDeltaPayload(EventStamp, ModelDeltaFields):
    """MODEL_DELTA: a piece of the streaming answer (live only)."""


class ModelResponsePayload(EventStamp, ModelResponseFields):
    """MODEL_RESPONSE: the model answered."""


class ToolStartedPayload(EventStamp, ToolStartedFields):
    """TOOL_STARTED: a tool call starts running."""


class ToolProgressPayload(EventStamp, ToolProgressFields):
    """TOOL_PROGRESS: a running tool reported progress (live only)."""


class ToolCompletedPayload(EventStamp, ToolCompletedFields):
    """TOOL_COMPLETED: a tool call's result was written."""


class TurnEndedPayload(EventStamp, TurnEndedFields):
    """A terminal event (TURN_COMPLETED, TURN_FAILED, ...): the turn ended."""


class ChatMemoryErrorPayload(EventStamp, ChatMemoryErrorFields):
    """CHAT_MEMORY_ERROR: projecting the saved turn into ChatMemory failed (live only)."""


class DeadlineApproachingPayload(EventStamp, DeadlineApproachingFields):
    """DEADLINE_APPROACHING: a waiting approval or form is most of the way to its deadline."""


E = AgentEventType

PAYLOAD_MODELS: Mapping[AgentEventType, type[BaseModel]] = {
    E.TURN_STARTED: TurnStartedPayload,
    E.TURN_RUNNING: TurnRunningPayload,
    E.TURN_SUSPENDED: TurnSuspendedPayload,
    E.TURN_RESUMED: TurnResumedPayload,
    E.RETRY_SCHEDULED: RetryScheduledPayload,
    E.MODEL_DELTA: ModelDeltaPayload,
    E.MODEL_RESPONSE: ModelResponsePayload,
    E.TOOL_STARTED: ToolStartedPayload,
    E.TOOL_PROGRESS: ToolProgressPayload,
    E.TOOL_COMPLETED: ToolCompletedPayload,
    E.TURN_COMPLETED: TurnEndedPayload,
    E.TURN_FAILED: TurnEndedPayload,
    E.TURN_CANCELLED: TurnEndedPayload,
    E.MAX_ITERATIONS_REACHED: TurnEndedPayload,
    E.MAX_STEPS_REACHED: TurnEndedPayload,
    E.BUDGET_EXCEEDED: TurnEndedPayload,
    E.CHAT_MEMORY_ERROR: ChatMemoryErrorPayload,
    E.DEADLINE_APPROACHING: DeadlineApproachingPayload,
    E.MESSAGE_QUEUED: MessageQueuedPayload,
    E.MESSAGE_FAILED: MessageFailedPayload,
    E.TURN_QUEUED: TurnQueuedPayload,
    E.TURN_RECOVERING: TurnRecoveringPayload,
    E.STEERING_ACCEPTED: SteeringAcceptedPayload,
    E.STEERING_APPLIED: SteeringAppliedPayload,
    E.STEERING_NOT_APPLIED: SteeringNotAppliedPayload,
}
"""The model of `AgentEvent.data` for each event type (an `EventStamp` for every type but the message events)."""


def payload_of(event: AgentEvent) -> BaseModel:
    """The event's `data` validated against the model of its type.

    Raises:
        pydantic.ValidationError: The data does not have the shape of its type.
    """
    return PAYLOAD_MODELS[event.type].model_validate(event.data)


# --- Constructors: the one place each event type's fields are built ----------------------------


class EventBody(NamedTuple):
    """An event's type and its fields, before the runner stamps the turn's status and version."""

    type: AgentEventType
    fields: _Payload

    def data(self, status: AgentTurnStatus, version: int) -> dict[str, Any]:
        """The event's `data`: the stamp, then the fields as JSON."""
        return {"status": status.value, "version": version, **self.fields.model_dump(mode="json", by_alias=True)}


def turn_started(turn: AgentTurn, message_id: str) -> EventBody:
    """TURN_STARTED of a new turn that starts from the user message `message_id`.

    A turn whose id is the one `queued_turn_id` derives for the message was started from
    that queued message, and says so.
    """
    queued = turn.conversation_id is not None and turn.id == queued_turn_id(
        turn.conversation_id, message_id, turn.tenant_id
    )
    fields = TurnStartedFields(
        agent_id=turn.agent_id,
        agent_version=turn.agent_version,
        parent_turn_id=turn.parent_turn_id,
        message_id=message_id,
        queued_message_id=message_id if queued else None,
        starts_at=turn.starts_at,
    )
    return EventBody(E.TURN_STARTED, fields)


def turn_queued(place: int, tenant_waiting: int) -> EventBody:
    """TURN_QUEUED: the new turn is `place` in its tenant's line of `tenant_waiting` turns waiting for admission."""
    return EventBody(E.TURN_QUEUED, TurnQueuedFields(place=place, tenant_waiting=tenant_waiting))


def turn_running() -> EventBody:
    """TURN_RUNNING: the turn left the queue."""
    return EventBody(E.TURN_RUNNING, TurnRunningFields())


def turn_recovering(recoveries: int, max_recoveries: int) -> EventBody:
    """TURN_RECOVERING: the `recoveries`-th takeover in a row without progress."""
    return EventBody(E.TURN_RECOVERING, TurnRecoveringFields(recoveries=recoveries, max_recoveries=max_recoveries))


def steering_accepted(message_id: str, text: str) -> EventBody:
    """STEERING_ACCEPTED: the steering message `message_id` was stored."""
    return EventBody(E.STEERING_ACCEPTED, SteeringAcceptedFields(message_id=message_id, text=text))


def steering_applied(message_ids: Sequence[str]) -> EventBody:
    """STEERING_APPLIED: these steering messages joined the history, in this order."""
    return EventBody(E.STEERING_APPLIED, SteeringAppliedFields(message_ids=list(message_ids)))


def steering_not_applied(message_ids: Sequence[str], reason: str, next_turn_id: str | None) -> EventBody:
    """STEERING_NOT_APPLIED: the turn ended without these steering messages; `next_turn_id` took them, if any."""
    fields = SteeringNotAppliedFields(message_ids=list(message_ids), reason=reason, next_turn_id=next_turn_id)
    return EventBody(E.STEERING_NOT_APPLIED, fields)


ArgumentMask = Callable[[ToolCall], Mapping[str, Any]]
"""Returns a call's arguments as they may be shown (sensitive values replaced)."""


def turn_suspended(turn: AgentTurn, mask: ArgumentMask) -> EventBody:
    """TURN_SUSPENDED of a suspended turn: its question, form or call (arguments through `mask`), and deadline."""
    suspension = turn.suspension
    if suspension is None:
        raise ValueError(f"turn {turn.id!r} is not suspended")
    call = next((c for c in turn.pending_tool_calls if c.id == suspension.correlation_id), None)
    form = suspension.form
    fields = TurnSuspendedFields(
        suspension_type=suspension.type,
        kind=suspension_kind(suspension),
        correlation_id=suspension.correlation_id,
        message=suspension.message,
        form_key=None if form is None else form.key,
        form=None if form is None else _form_fields(form),
        tool_call=None if call is None else ToolCallFields(id=call.id, name=call.name, arguments=dict(mask(call))),
        deadline=None if suspension.deadline is None else suspension.deadline.isoformat(),
        on_timeout=suspension.on_timeout,
    )
    return EventBody(E.TURN_SUSPENDED, fields)


def suspension_kind(suspension: AgentSuspension) -> SuspensionKind | None:
    """`approval` for a TOOL_APPROVAL suspension, `outcome_unknown` for a TOOL_OUTCOME_UNKNOWN one; None for the others."""
    if suspension.is_outcome_unknown:
        return "outcome_unknown"
    return "approval" if suspension.type is SuspensionType.TOOL_APPROVAL else None


def _form_fields(form: AgentFormDefinition) -> FormFields:
    return FormFields(key=form.key, description=form.description, schema_=form.schema)


def turn_resumed(
    *,
    command: ResumeType | None,
    tool_call_id: str | None = None,
    child_turn_id: str | None = None,
    reason: str | None = None,
    attempt: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> EventBody:
    """TURN_RESUMED: `command` applied (None: a scheduled retry came due, at `attempt`)."""
    fields = TurnResumedFields(
        command=command,
        tool_call_id=tool_call_id,
        child_turn_id=child_turn_id,
        reason=reason,
        attempt=attempt,
        metadata=dict(metadata or {}),
    )
    return EventBody(E.TURN_RESUMED, fields)


def retry_scheduled(
    turn: AgentTurn, error: str, *, limit_key: str | None = None, limit_reason: LimitReason | None = None
) -> EventBody:
    """RETRY_SCHEDULED of a turn saved RETRY_SCHEDULED because of `error` (or waiting for the model limit `limit_key`)."""
    next_at = None if turn.next_retry_at is None else turn.next_retry_at.isoformat()
    fields = RetryScheduledFields(
        attempt=turn.attempt, next_retry_at=next_at, error=error, limit_key=limit_key, limit_reason=limit_reason
    )
    return EventBody(E.RETRY_SCHEDULED, fields)


def model_delta(delta: str, lease_fence: int | None) -> EventBody:
    """MODEL_DELTA: a piece of streamed text."""
    return EventBody(E.MODEL_DELTA, ModelDeltaFields(delta=delta, lease_fence=lease_fence))


def model_response(
    message_id: str,
    content: str | None,
    tool_names: list[str],
    input_tokens: int,
    output_tokens: int,
    model: str | None = None,
) -> EventBody:
    """MODEL_RESPONSE: the answer's message id, whole text, called tools, token counts and the model that answered."""
    fields = ModelResponseFields(
        message_id=message_id,
        content=content,
        tool_calls=tool_names,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        model=model,
    )
    return EventBody(E.MODEL_RESPONSE, fields)


def tool_started(call: ToolCall) -> EventBody:
    """TOOL_STARTED of `call`."""
    return EventBody(E.TOOL_STARTED, ToolStartedFields(tool_call_id=call.id, tool_name=call.name))


def tool_progress(call: ToolCall, progress: Any) -> EventBody:
    """TOOL_PROGRESS of `call` (`progress` must be JSON)."""
    return EventBody(E.TOOL_PROGRESS, ToolProgressFields(tool_call_id=call.id, tool_name=call.name, progress=progress))


def tool_completed(call: ToolCall, is_error: bool, *, reconciled: bool = False) -> EventBody:
    """TOOL_COMPLETED of `call`."""
    fields = ToolCompletedFields(tool_call_id=call.id, tool_name=call.name, is_error=is_error, reconciled=reconciled)
    return EventBody(E.TOOL_COMPLETED, fields)


def turn_ended(turn: AgentTurn, event_type: AgentEventType) -> EventBody:
    """The terminal event `event_type` of an ended turn."""
    if not event_type.is_terminal:
        raise ValueError(f"{event_type} is not a terminal event type")
    return EventBody(event_type, TurnEndedFields(error=turn.error, final_output=turn.final_output))


def chat_memory_error(error: str) -> EventBody:
    """CHAT_MEMORY_ERROR: projection into ChatMemory failed with `error`."""
    return EventBody(E.CHAT_MEMORY_ERROR, ChatMemoryErrorFields(error=error))


def message_queued(message_id: str, sequence: int, ahead: int, content: str, agent_id: str | None) -> dict[str, Any]:
    """The `data` of MESSAGE_QUEUED."""
    fields = MessageQueuedPayload(
        message_id=message_id, sequence=sequence, ahead=ahead, content=content, agent_id=agent_id
    )
    return fields.model_dump(mode="json")


def message_failed(message_id: str, error: str) -> dict[str, Any]:
    """The `data` of MESSAGE_FAILED."""
    return MessageFailedPayload(message_id=message_id, error=error).model_dump(mode="json")


def deadline_approaching(suspension: AgentSuspension) -> EventBody:
    """DEADLINE_APPROACHING of a suspension that has a deadline."""
    if suspension.deadline is None:
        raise ValueError("a suspension without a deadline has no reminder")
    fields = DeadlineApproachingFields(
        correlation_id=suspension.correlation_id,
        suspension_type=suspension.type,
        deadline=suspension.deadline.isoformat(),
        on_timeout=suspension.on_timeout,
    )
    return EventBody(E.DEADLINE_APPROACHING, fields)
