"""Request and response models of the HTTP API (they are also its OpenAPI schemas).

Requests are strict: unknown fields, wrong types and ids outside `[A-Za-z0-9._:-]{1,128}`
are refused with 422 before anything is done. Responses are documented here; the routes
build them from `workers.views`, which the command line shares.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=128)]
"""An id chosen by a client or the server: 1 to 128 of `A-Z a-z 0-9 . _ : -`."""

JsonObject = dict[str, Any]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    if_busy: Literal["reject", "enqueue", "interrupt"] = Field(
        default="reject",
        description=(
            "When the conversation has an active turn: `reject` answers 409; `enqueue` queues the message "
            "(202, started when the conversation frees); `interrupt` cancels the active turn and starts this one."
        ),
    )


class ResumeRequest(_Request):
    """A person's decision for a waiting turn."""

    action: Literal["approve", "reject", "input", "form", "retry", "tool_result"] = Field(
        description=(
            "`approve`/`reject` a tool call (`tool_call_id`), answer a plain-text question (`input` with "
            "`content`), submit a form (`form` with `tool_call_id` and `data`), or `retry` now. For a call whose "
            "outcome is unknown (card `kind` `outcome_unknown`): `approve` runs it again, `reject` fails it, and "
            "`tool_result` marks it done with `content` as its result."
        )
    )
    tool_call_id: Identifier | None = Field(
        default=None, description="The tool call decided on (suspension.correlation_id)."
    )
    content: str | None = Field(
        default=None, min_length=1, description="The answer text, for `input`; the call's result, for `tool_result`."
    )
    data: JsonObject | None = Field(
        default=None, description="The form data, for `form`; checked against the frozen schema."
    )
    reason: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Why, for `reject` (the model reads it), `approve` or `tool_result` (recorded with the decision and "
            "shown on the card as `reason`)."
        ),
    )
    metadata: JsonObject = Field(default_factory=dict, description="Who decided and why; recorded with the decision.")


class CancelRequest(_Request):
    """Cancel a turn and its children."""

    reason: str | None = Field(default=None, min_length=1, description="Recorded in the close-out of the history.")


# --- Responses --------------------------------------------------------------------------------


class ErrorInfo(_Response):
    """What went wrong."""

    type: str = Field(description="The error's class, e.g. `TurnNotFound`, `InvalidResumeCommand`, `InvalidRequest`.")
    message: str
    details: list[JsonObject] = Field(
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
    arguments: JsonObject


class FormView(_Response):
    """A form to fill in, with its JSON Schema frozen when the turn suspended."""

    key: str
    description: str
    schema_: JsonObject = Field(alias="schema")


class SuspensionView(_Response):
    """Why a turn waits."""

    type: Literal["USER_INPUT", "TOOL_APPROVAL", "CHILD_AGENT", "RETRY"]
    kind: Literal["approval", "outcome_unknown"] | None = Field(
        description=(
            "For TOOL_APPROVAL: `approval` (the call waits to run; approve or reject it) or `outcome_unknown` "
            "(it started and its outcome was never recorded; approve to run it again, `tool_result` to mark it "
            "done, reject to fail it). Null for other suspensions."
        )
    )
    correlation_id: str | None = Field(description="The tool call a resume must name (null for a plain question).")
    message: str
    form: FormView | None
    tool_call: ToolCallView | None
    deadline: str | None = Field(
        default=None,
        description="When `on_timeout` applies if nobody decided (ISO 8601); null when the wait has no deadline.",
    )
    on_timeout: Literal["approve", "reject", "submit"] | None = Field(
        default=None, description="What the deadline does: approve or reject the call, or submit the form's default."
    )


class UsageView(_Response):
    """Tokens and cost so far."""

    input_tokens: int
    output_tokens: int
    cost: float


TurnStatusName = Literal[
    "READY",
    "RUNNING",
    "WAITING_FOR_USER",
    "WAITING_FOR_APPROVAL",
    "WAITING_FOR_CHILD",
    "RETRY_SCHEDULED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "MAX_ITERATIONS_REACHED",
    "MAX_STEPS_REACHED",
    "BUDGET_EXCEEDED",
]


class TurnView(_Response):
    """A turn as stored; `messages` only with `?messages=true`."""

    id: str
    agent_id: str
    agent_version: str
    conversation_id: str | None
    parent_turn_id: str | None
    root_turn_id: str
    status: TurnStatusName
    phase: Literal["MODEL", "TOOLS"]
    suspension: SuspensionView | None
    pending_tool_calls: list[ToolCallView]
    final_output: str | None
    error: str | None
    usage: UsageView
    model_iterations: int
    steps: int
    attempt: int
    next_retry_at: str | None
    cancel_requested: bool
    metadata: JsonObject
    created_at: str
    updated_at: str
    version: int
    messages: list[JsonObject] | None = Field(
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

    items: list[JsonObject]


class ToolInfo(_Response):
    """A tool an agent may call."""

    name: str
    description: str
    requires_approval: bool


class FormInfo(_Response):
    """A form an agent may ask for."""

    key: str
    description: str
    schema_: JsonObject = Field(alias="schema")


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
