"""Request and response models of the HTTP API (they are also its OpenAPI schemas).

Requests are strict: unknown fields, wrong types and ids outside `[A-Za-z0-9._:-]{1,128}`
are refused with 422 before anything is done. Responses are documented here; the routes
build them from `workers.views`, which the command line shares.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StringConstraints,
    create_model,
    model_validator,
)

from agent_runner import ActionStatus, AgentEventType, AgentTurnStatus, Phase, SuspensionType
from agent_runner.event_payloads import PAYLOAD_MODELS, SUSPENSION_KIND_DESCRIPTION, SuspensionKind
from agent_runner.event_payloads import JsonObject as TypedJsonObject
from agent_runner.suspensions import TimeoutAction

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=128)]
"""An id chosen by a client or the server: 1 to 128 of `A-Z a-z 0-9 . _ : -`."""


def _whole_float_as_int(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole_float_as_int)]
"""An integer of a strict request model that also takes JSON's `448.0`, as JSON Schema's `integer` does."""


JsonObject = dict[str, Any]
"""Any JSON object, untyped: for request fields whose values nothing here reads."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _open_object(schema: dict[str, Any]) -> None:
    # Responses may gain fields; leaving `additionalProperties` out says so (JSON Schema's
    # default) without making generated clients type every object as a map of unknowns.
    schema.pop("additionalProperties", None)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_open_object)


# --- Requests ---------------------------------------------------------------------------------


class StartTurnRequest(_Request):
    """Start a turn of an agent, optionally inside a conversation."""

    agent_id: Identifier = Field(description="The agent to run (see GET /v1/agents).")
    input: str = Field(min_length=1, description="The user's message.")
    conversation_id: Identifier | None = Field(
        default=None,
        description="Run inside this conversation: history comes from it, and it runs one turn at a time.",
    )
    metadata: JsonObject = Field(default_factory=dict, description="JSON kept with the turn (a user id, a request id).")
    if_busy: Literal["reject", "enqueue", "interrupt", "steer"] = Field(
        default="reject",
        description=(
            "When the conversation has an active turn: `reject` answers 409; `enqueue` queues the message "
            "(202, started when the conversation frees); `interrupt` cancels the active turn and starts this one; "
            "`steer` adds the message to the active turn, read before its next model call (202 with that turn; "
            "if it ends first, the message starts the conversation's next turn)."
        ),
    )
    start_after_seconds: float | None = Field(
        default=None,
        description=(
            "Start the turn this many seconds from now (at most the runner's `max_start_delay_s`, 30 days by "
            "default): it is saved READY, shown with `starts_at`, and holds its conversation while it waits. "
            "A message that would have to queue behind the conversation's active turn cannot be delayed (422)."
        ),
    )


class _Resume(_Request):
    """Fields every resume action takes; fields an action does not use may be sent as null (they are dropped)."""

    metadata: TypedJsonObject = Field(
        default_factory=dict, description="Who decided and why; recorded with the decision."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_unused_nulls(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if v is not None or k in cls.model_fields}
        return value


ToolCallId = Annotated[Identifier, Field(description="The tool call decided on (suspension.correlation_id).")]
Reason = Annotated[str, StringConstraints(min_length=1)]


class ApproveRequest(_Resume):
    """Approve a waiting tool call (for a call whose outcome is unknown: run it again)."""

    action: Literal["approve"]
    tool_call_id: ToolCallId
    reason: Reason | None = Field(default=None, description="Recorded with the decision, shown on the card.")


class RejectRequest(_Resume):
    """Reject a waiting tool call (for a call whose outcome is unknown: fail it; for a form: decline it)."""

    action: Literal["reject"]
    tool_call_id: ToolCallId
    reason: Reason | None = Field(default=None, description="Why; the model reads it.")


class InputRequest(_Resume):
    """Answer a plain-text question."""

    action: Literal["input"]
    content: Annotated[str, StringConstraints(min_length=1)] = Field(description="The answer text.")


class FormRequest(_Resume):
    """Submit a form; the data is checked against the frozen schema."""

    action: Literal["form"]
    tool_call_id: ToolCallId
    data: TypedJsonObject = Field(description="The form data.")


class RetryRequest(_Resume):
    """Run a turn that waits for a scheduled retry now."""

    action: Literal["retry"]


class ToolResultRequest(_Resume):
    """Mark a call whose outcome is unknown (card `kind` `outcome_unknown`) done, with its result."""

    action: Literal["tool_result"]
    tool_call_id: ToolCallId
    content: Annotated[str, StringConstraints(min_length=1)] = Field(description="The call's result.")
    reason: Reason | None = Field(default=None, description="Recorded with the decision, shown on the card.")


AnyResumeRequest = Annotated[
    ApproveRequest | RejectRequest | InputRequest | FormRequest | RetryRequest | ToolResultRequest,
    Field(discriminator="action"),
]


class ResumeRequest(RootModel[AnyResumeRequest]):
    """A person's decision for a waiting turn, one shape per `action`.

    `approve`/`reject` a tool call, answer a plain-text question (`input`), submit a form
    (`form`), or `retry` now. For a call whose outcome is unknown (card `kind`
    `outcome_unknown`): `approve` runs it again, `reject` fails it, and `tool_result` marks it
    done with `content` as its result.
    """


RESUME_REQUESTS: tuple[type[_Resume], ...] = (
    ApproveRequest,
    RejectRequest,
    InputRequest,
    FormRequest,
    RetryRequest,
    ToolResultRequest,
)


def resume_fields(request: ResumeRequest) -> dict[str, Any]:
    """The fields of a resume request besides `action` and `metadata`, as keyword arguments of `resume_command`."""
    action = request.root
    return {name: getattr(action, name) for name in type(action).model_fields if name not in ("action", "metadata")}


class CancelRequest(_Request):
    """Cancel a turn and its children."""

    reason: str | None = Field(default=None, min_length=1, description="Recorded in the close-out of the history.")


# --- Responses --------------------------------------------------------------------------------


class ErrorInfo(_Response):
    """What went wrong."""

    type: str = Field(description="The error's class, e.g. `TurnNotFound`, `InvalidResumeCommand`, `InvalidRequest`.")
    message: str
    details: list[TypedJsonObject] = Field(
        default_factory=list, description='Per-field problems, e.g. `{"path": "/field", "message": "..."}`.'
    )
    active_turn_id: str | None = Field(default=None, description="The turn that keeps a conversation busy (409).")


class ErrorResponse(_Response):
    """Every error answer of the API."""

    error: ErrorInfo


class ToolCallView(_Response):
    """A tool call; arguments the tool marks sensitive are shown as `***`."""

    id: str
    name: str
    arguments: TypedJsonObject


class FormView(_Response):
    """A form to fill in, with its JSON Schema frozen when the turn suspended."""

    key: str
    description: str
    schema_: TypedJsonObject = Field(alias="schema")


class SuspensionView(_Response):
    """Why a turn waits."""

    type: SuspensionType
    kind: SuspensionKind | None = Field(description=SUSPENSION_KIND_DESCRIPTION)
    correlation_id: str | None = Field(description="The tool call a resume must name (null for a plain question).")
    message: str
    form: FormView | None
    tool_call: ToolCallView | None
    deadline: str | None = Field(
        default=None,
        description="When `on_timeout` applies if nobody decided (ISO 8601); null when the wait has no deadline.",
    )
    on_timeout: TimeoutAction | None = Field(
        default=None, description="What the deadline does: approve or reject the call, or submit the form's default."
    )


class SystemMessageView(_Response):
    """Instructions for the model."""

    role: Literal["system"]
    id: str
    content: str


class UserMessageView(_Response):
    """A message the user typed."""

    role: Literal["user"]
    id: str
    content: str


class AssistantMessageView(_Response):
    """A model response: text, tool calls (arguments masked), or both."""

    role: Literal["assistant"]
    id: str
    content: str | None
    tool_calls: list[ToolCallView]


class ToolMessageView(_Response):
    """The result of a tool call."""

    role: Literal["tool"]
    id: str
    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool


class _PageItemView(_Response):
    id: str
    version: int
    turn_id: str
    action_id: str = Field(description="The tool call the item stands for.")
    status: ActionStatus
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    actions: list[str] = Field(description="What the page may still offer (none once decided).")


class AgentActionItemView(_PageItemView):
    """An approval card for a tool call (`kind` `approval`) or a call whose outcome is unknown."""

    role: Literal["agent_action"]
    tool_name: str
    summary: str
    arguments: TypedJsonObject = Field(description="Sensitive values are `***`.")
    kind: SuspensionKind


class AgentFormItemView(_PageItemView):
    """A form to fill in, with its frozen JSON Schema."""

    role: Literal["agent_form"]
    form_key: str
    description: str
    schema_: TypedJsonObject = Field(alias="schema")


TurnMessageView = Annotated[
    SystemMessageView | UserMessageView | AssistantMessageView | ToolMessageView, Field(discriminator="role")
]
"""A message of a turn, by `role`."""

PageItemView = Annotated[
    UserMessageView | AssistantMessageView | ToolMessageView | AgentActionItemView | AgentFormItemView,
    Field(discriminator="role"),
]
"""An item of a conversation's page timeline, by `role`."""


class UsageView(_Response):
    """Tokens and cost so far."""

    input_tokens: int
    output_tokens: int
    cost: float


class TurnView(_Response):
    """A turn as stored; `messages` only with `?messages=true`."""

    id: str
    agent_id: str
    agent_version: str
    conversation_id: str | None
    parent_turn_id: str | None
    root_turn_id: str
    status: AgentTurnStatus
    phase: Phase
    suspension: SuspensionView | None
    pending_tool_calls: list[ToolCallView]
    final_output: str | None
    error: str | None
    usage: UsageView
    model_iterations: int
    steps: int
    attempt: int
    next_retry_at: str | None = Field(description="When a RETRY_SCHEDULED turn retries (ISO 8601); null otherwise.")
    starts_at: str | None = Field(
        description="When a READY turn started with a delay may start (ISO 8601); it is queued until then. Null otherwise."
    )
    cancel_requested: bool
    metadata: TypedJsonObject
    created_at: str
    updated_at: str
    version: int
    messages: list[TurnMessageView] | None = Field(
        default=None, description="The turn's messages (tool-call arguments masked), with `?messages=true`."
    )


class TurnList(_Response):
    """A page of turns, newest first."""

    items: list[TurnView]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last one.")


class QueuedView(_Response):
    """The message was queued: the conversation starts it when its active turn ends."""

    status: Literal["QUEUED"]
    message_id: str
    conversation_id: str


class MessageList(_Response):
    """A conversation's page timeline, oldest first.

    Items are the messages of the conversation (`role` user, assistant, tool) and its page
    messages, each with the `actions` it still offers: `agent_action` (a card for a tool
    call: `tool_name`, `summary`, masked `arguments`, `kind` `approval` with actions
    APPROVE/REJECT or `outcome_unknown` with RETRY/MARK_DONE/FAIL, `status`
    PENDING/APPROVED/REJECTED/SUBMITTED/CANCELLED) and `agent_form` (`form_key`, `schema`,
    `status` PENDING/SUBMITTED/CANCELLED). Once decided, a page message has `decided_at`,
    `decided_by` (from the resume's `metadata`: `decided_by`, `approverId` or `user_id`;
    `system` when the turn ended while it was pending) and `reason`.
    """

    items: list[PageItemView]


class UIMessageView(_Response):
    """A message of `useChat` as `GET .../ai-sdk/chat/{chat_id}/messages` shows it."""

    id: str = Field(description="Stable; an assistant message's is its turn's id when the turn is known.")
    role: Literal["user", "assistant"]
    parts: list[TypedJsonObject] = Field(
        description=(
            "`text`, `step-start`, `tool-<name>` (`toolCallId`, `state`, `input`, and `approval`, `output` or "
            "`errorText` as the state has them), `data-form` and `data-question` parts, as the stream makes them."
        )
    )
    metadata: TypedJsonObject | None = Field(
        default=None, description="`turnId` and `conversationId` of an assistant message whose turn is known."
    )


class ToolInfo(_Response):
    """A tool an agent may call."""

    name: str
    description: str
    requires_approval: bool


class FormInfo(_Response):
    """A form an agent may ask for."""

    key: str
    description: str
    schema_: TypedJsonObject = Field(alias="schema")


class AgentInfo(_Response):
    """An agent the server can run."""

    id: str
    version: str
    tools: list[ToolInfo]
    forms: list[FormInfo]


class AgentList(_Response):
    """The agents of the server."""

    items: list[AgentInfo]


class HealthView(_Response):
    """The process answers."""

    status: Literal["ok"]


class ReadyView(_Response):
    """Every dependency answered."""

    status: Literal["ok"]
    checks: dict[str, str]


# --- Events (the `data:` of each server-sent event) ------------------------------------------


class _EventEnvelope(_Response):
    event_id: str
    turn_id: str
    root_turn_id: str | None
    conversation_id: str | None
    timestamp: datetime
    cursor: str | None = Field(description="The event's position; resume after it with `after` or `Last-Event-ID`.")


def _event_view(payload: type[BaseModel], types: list[AgentEventType]) -> type[_EventEnvelope]:
    """The envelope of the events whose `data` is `payload`, discriminated by their `type`."""
    kind: Any = Literal.__getitem__(tuple(t.value for t in types))
    name = payload.__name__.removesuffix("Payload") + "Event"
    view: type[_EventEnvelope] = create_model(
        name, __base__=_EventEnvelope, __doc__=payload.__doc__, type=(kind, ...), data=(payload, ...)
    )
    return view


def _event_views() -> tuple[type[_EventEnvelope], ...]:
    by_payload: dict[type[BaseModel], list[AgentEventType]] = {}
    for event_type, payload in PAYLOAD_MODELS.items():
        by_payload.setdefault(payload, []).append(event_type)
    return tuple(_event_view(payload, types) for payload, types in by_payload.items())


EVENT_VIEWS = _event_views()
"""One model per payload shape of `agent_runner.event_payloads`, with the event types that carry it."""

if TYPE_CHECKING:
    AnyEventView = _EventEnvelope
else:
    AnyEventView = Annotated[Union[EVENT_VIEWS], Field(discriminator="type")]  # noqa: UP007


class AgentEventView(RootModel[AnyEventView]):
    """One event, as the JSON of an SSE `data:` line; `type` (also the SSE `event:`) tells the shape of `data`."""
