"""The turn snapshot `AgentTurn`: the only state of a turn, saved at every stable boundary."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from agent_runner._base import FrozenModel
from agent_runner.ids import utcnow
from agent_runner.messages import ActionStatus, ModelMessage, ToolCall
from agent_runner.suspensions import AgentSuspension, Phase
from agent_runner.usage import Usage

SCHEMA_VERSION = 1


class AgentTurnStatus(StrEnum):
    """Lifecycle status of a turn. Values are stored in databases: add, never rename."""

    READY = "READY"
    RUNNING = "RUNNING"
    WAITING_FOR_USER = "WAITING_FOR_USER"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    WAITING_FOR_CHILD = "WAITING_FOR_CHILD"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MAX_ITERATIONS_REACHED = "MAX_ITERATIONS_REACHED"
    MAX_STEPS_REACHED = "MAX_STEPS_REACHED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"

    @property
    def is_terminal(self) -> bool:
        """Whether the turn has ended for good."""
        return self in TERMINAL_STATUSES

    @property
    def is_waiting(self) -> bool:
        """Whether the turn waits for a person, a child turn or a retry time."""
        return self in WAITING_STATUSES


TERMINAL_STATUSES = frozenset(
    {
        AgentTurnStatus.COMPLETED,
        AgentTurnStatus.FAILED,
        AgentTurnStatus.CANCELLED,
        AgentTurnStatus.MAX_ITERATIONS_REACHED,
        AgentTurnStatus.MAX_STEPS_REACHED,
        AgentTurnStatus.BUDGET_EXCEEDED,
    }
)
WAITING_STATUSES = frozenset(
    {
        AgentTurnStatus.WAITING_FOR_USER,
        AgentTurnStatus.WAITING_FOR_APPROVAL,
        AgentTurnStatus.WAITING_FOR_CHILD,
        AgentTurnStatus.RETRY_SCHEDULED,
    }
)
WAITING_FOR_A_PERSON = frozenset({AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_APPROVAL})
"""Statuses in which a turn waits for a person: an answer, a form or an approval."""
DEADLINE_STATUSES = WAITING_FOR_A_PERSON
"""Statuses whose suspension may carry a deadline: exactly the waits for a person."""
RUNNABLE_STATUSES = frozenset({AgentTurnStatus.READY, AgentTurnStatus.RUNNING})
"""Statuses a worker steps (RETRY_SCHEDULED becomes runnable at `next_retry_at`; a READY turn
started with a delay waits for it too, see `SCHEDULED_STATUSES`)."""
SCHEDULED_STATUSES = frozenset({AgentTurnStatus.READY, AgentTurnStatus.RETRY_SCHEDULED})
"""Statuses in which a set `next_retry_at` means "not runnable before": the time of a scheduled
retry, or the start time of a READY turn started with a delay (`AgentRunner.start(not_before=...)`)."""


def is_runnable(status: AgentTurnStatus, next_retry_at: datetime | None, now: datetime | None = None) -> bool:
    """Whether a worker may step a turn in `status` now (a retry or a delayed start once `next_retry_at` has come)."""
    if status in SCHEDULED_STATUSES and next_retry_at is not None:
        return next_retry_at <= (now or utcnow())
    return status in RUNNABLE_STATUSES or status is AgentTurnStatus.RETRY_SCHEDULED


class ChildLink(FrozenModel):
    """A child turn created for one delegation call of this turn."""

    tool_call_id: str
    agent_id: str
    child_turn_id: str
    status: AgentTurnStatus | None = None
    """The child's terminal status once it has been recorded here, else None."""
    output: str | None = None
    """The child's final output, or the reason it did not complete."""


class PageAction(FrozenModel):
    """A page message (approval card or form) this turn owns in ChatMemory, and the state to show."""

    message_id: str
    action_id: str
    kind: str
    """`"approval"` or `"form"`."""
    status: ActionStatus = ActionStatus.PENDING
    synced: bool = False
    """Whether ChatMemory is known to show `status`; unsynced actions are reconciled after each save."""
    payload: dict[str, Any] = Field(default_factory=dict)
    """The page message as first shown (JSON), so a failed projection can be redone from the snapshot."""
    decision: dict[str, Any] = Field(default_factory=dict)
    """`decided_by`, `decided_at` and `reason` of the decision, once there is one (shown on the page message)."""


class ListedTool(FrozenModel):
    """A tool a toolset (an MCP server, say) offered when the turn first called its model.

    The turn keeps the list it was shown: a turn resumed after the server changed calls its
    tools with the schemas its model saw.
    """

    toolset: str
    """Name of the toolset that listed it (see `Toolset.name`)."""
    name: str
    """The name the model knows it by (the toolset's prefix included)."""
    remote_name: str
    """The name the toolset calls it by."""
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """The JSON Schema of its arguments, as the toolset gave it."""
    annotations: dict[str, Any] = Field(default_factory=dict)
    """What the toolset said about its effects (for MCP: `readOnlyHint`, `idempotentHint`, ...)."""


class AgentTurn(FrozenModel):
    """Snapshot of one agent turn. Immutable: the runner derives a new snapshot for every change.

    `messages` holds the turn's whole model-visible history: the history window the turn
    started from, the new user message, and everything the turn added.
    """

    id: str
    agent_id: str
    agent_version: str = "1"
    conversation_id: str | None = None
    parent_turn_id: str | None = None
    root_turn_id: str = ""
    """Id of the root of this turn's tree; a root turn's own id (the default)."""
    status: AgentTurnStatus = AgentTurnStatus.READY
    phase: Phase = Phase.MODEL
    messages: list[ModelMessage] = Field(default_factory=list)
    pending_tool_calls: list[ToolCall] = Field(default_factory=list)
    """Calls of the latest model response that have no ToolMessage yet, in call order."""
    suspension: AgentSuspension | None = None
    version: int = -1
    """Compare-and-swap version: -1 before the first save, then 0, 1, 2, ..."""
    model_iterations: int = 0
    steps: int = 0
    usage: Usage = Field(default_factory=Usage)
    attempt: int = 0
    """Failed attempts of the current model or tool call (reset when one succeeds)."""
    next_retry_at: datetime | None = None
    """Not runnable before this time: when a RETRY_SCHEDULED turn retries, or when a READY turn
    started with a delay starts (see `starts_at`); None otherwise. The first step clears it."""
    cancel_requested: bool = False
    cancel_reason: str | None = None
    """The reason given with the first cancel request of a RUNNING turn (None: none given); the
    turn ends CANCELLED with it at its next boundary."""
    final_output: str | None = None
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    schema_version: int = SCHEMA_VERSION
    """Layout version of this snapshot, so that old snapshots keep loading."""
    approved_call_ids: list[str] = Field(default_factory=list)
    form_data: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Form data submitted for tools that raised `AgentFormRequiredException`, by call id."""
    children: list[ChildLink] = Field(default_factory=list)
    page_actions: list[PageAction] = Field(default_factory=list)
    projected_count: int = 0
    """How many leading `messages` are known to be in ChatMemory."""
    lease_fence: int | None = None
    """Fencing number of the lease under which this snapshot was saved, if any."""
    started_call_ids: list[str] = Field(default_factory=list)
    """Calls of non-idempotent tools whose body started and whose outcome is not recorded yet."""
    recoveries: int = 0
    """Lease takeovers in a row without progress (see `AgentExecutionPolicy.max_recoveries`)."""
    recovery_fence: int | None = None
    """The fence of the holder that recorded the last takeover, and `recovery_steps` the turn's steps then:
    a next holder that finds the turn saved by nobody since knows that holder died too."""
    recovery_steps: int = 0
    steered_message_ids: list[str] = Field(default_factory=list)
    """Ids of the steering messages (`AgentRunner.steer`) this turn applied, in the order they joined its history."""
    step_failures: int = 0
    """Consecutive steps that raised an unexpected exception (reset by any step that saves)."""
    root_conversation_id: str | None = None
    """The conversation of the root turn, on child turns too: events of the whole tree are
    published under it, so a conversation's event stream includes its child turns."""
    tenant_id: str | None = None
    """The tenant that owns the turn (set by the HTTP server when API keys are configured);
    child turns inherit it. None in a single-tenant deployment."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Caller-supplied JSON data kept with the turn (for example a request or user id)."""
    listed_tools: list[ListedTool] | None = None
    """The tools of the agent's toolsets shown to the model in this turn; None before they are listed."""
    tool_state: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """What a tool keeps across the rounds of one call (for example an MCP server's request
    state between two questions to the user), by call id; dropped once the call is answered."""
    trace_context: dict[str, str] = Field(default_factory=dict)
    """Trace context (W3C `traceparent`, `tracestate`) under which the turn was created, so that
    every step, in any process, continues one trace; empty when no tracing was set up."""

    @model_validator(mode="before")
    @classmethod
    def _root_defaults_to_self(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("root_turn_id") and data.get("id"):
            return {**data, "root_turn_id": data["id"]}
        return data

    @property
    def is_terminal(self) -> bool:
        """Whether the turn has ended for good."""
        return self.status.is_terminal

    @property
    def wake_at(self) -> datetime | None:
        """When the deadline sweep must next look at this waiting turn (its reminder or deadline), else None."""
        if self.suspension is None or self.status not in DEADLINE_STATUSES:
            return None
        return self.suspension.wake_at

    @property
    def starts_at(self) -> datetime | None:
        """When a READY turn started with a delay may start (it is queued until then), else None."""
        return self.next_retry_at if self.status is AgentTurnStatus.READY else None

    def child(self, tool_call_id: str) -> ChildLink | None:
        """The child link created for a delegation call, if any."""
        return next((c for c in self.children if c.tool_call_id == tool_call_id), None)

    def is_runnable(self, now: datetime | None = None) -> bool:
        """Whether a worker may step the turn now."""
        return is_runnable(self.status, self.next_retry_at, now)
