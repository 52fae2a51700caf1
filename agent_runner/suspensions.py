"""Why a turn waits (`AgentSuspension`) and how it is continued (`AgentResumeCommand`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field, model_validator

from agent_runner._base import FrozenModel, PositionalModel
from agent_runner.forms import AgentFormDefinition
from agent_runner.ids import utcnow


class Phase(StrEnum):
    """Where a turn continues: calling the model, or executing recorded tool calls."""

    MODEL = "MODEL"
    TOOLS = "TOOLS"


class SuspensionType(StrEnum):
    """What a suspended turn waits for."""

    USER_INPUT = "USER_INPUT"
    TOOL_APPROVAL = "TOOL_APPROVAL"
    CHILD_AGENT = "CHILD_AGENT"
    RETRY = "RETRY"
    TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
    """A non-idempotent tool call started and its outcome was never recorded: a person retries it,
    marks it done with its result, or fails it. The turn is WAITING_FOR_APPROVAL."""

    @property
    def is_tool_decision(self) -> bool:
        """Whether a person decides about a tool call: TOOL_APPROVAL or TOOL_OUTCOME_UNKNOWN."""
        return self in (SuspensionType.TOOL_APPROVAL, SuspensionType.TOOL_OUTCOME_UNKNOWN)

    @property
    def waits_for_a_person(self) -> bool:
        """Whether a person resumes the turn (a child turn or a retry waits for nobody)."""
        return self is SuspensionType.USER_INPUT or self.is_tool_decision


class TimeoutAction(StrEnum):
    """What happens to a waiting tool call or form when its deadline passes.

    `APPROVE` and `REJECT` decide an approval; `REJECT` on a form answers the call with an
    error ToolMessage saying nobody filled it in; `SUBMIT` submits the form's `default_data`.
    """

    APPROVE = "approve"
    REJECT = "reject"
    SUBMIT = "submit"


OUTCOME_UNKNOWN_REASON = "outcome_unknown"
"""`metadata["reason"]` of a TOOL_OUTCOME_UNKNOWN suspension.

Snapshots and events written before that type existed marked a TOOL_APPROVAL suspension
this way; it is still written for their readers, and such a suspension is read back as
TOOL_OUTCOME_UNKNOWN.
"""

DEADLINE_REASON = "deadline passed"
"""The reason recorded on a decision taken because a deadline passed."""


class AgentSuspension(PositionalModel):
    """The reason a turn stopped without finishing, saved in its snapshot.

    `correlation_id` is the tool call id the resume command must name (None for a plain
    text question). For forms, `form` holds the full definition, schema included, frozen
    when the turn suspended: submitted data is validated against it, never against a
    schema the model or the client supplies.
    """

    _positional: ClassVar[tuple[str, ...]] = (
        "type",
        "correlation_id",
        "message",
        "resume_phase",
        "metadata",
        "form",
    )

    type: SuspensionType
    correlation_id: str | None = None
    message: str = ""
    resume_phase: Phase = Phase.MODEL
    metadata: dict[str, Any] = Field(default_factory=dict)
    form: AgentFormDefinition | None = None
    created_at: datetime = Field(default_factory=utcnow)
    deadline: datetime | None = None
    """When the decision is due; after it, `on_timeout` is applied (by a sweep) as if decided by `"system"`."""
    on_timeout: TimeoutAction | None = None
    """The default applied when `deadline` passes (set together with it)."""
    remind_at: datetime | None = None
    """When the DEADLINE_APPROACHING event is due (a fraction of the way to the deadline), if any."""
    reminded_at: datetime | None = None
    """When DEADLINE_APPROACHING was emitted; it is emitted once."""

    @model_validator(mode="before")
    @classmethod
    def _older_outcome_unknown(cls, data: Any) -> Any:
        """Read a TOOL_APPROVAL suspension marked with `OUTCOME_UNKNOWN_REASON` (an older snapshot) as the new type."""
        if (
            isinstance(data, dict)
            and data.get("type") == SuspensionType.TOOL_APPROVAL
            and isinstance(data.get("metadata"), Mapping)
            and data["metadata"].get("reason") == OUTCOME_UNKNOWN_REASON
        ):
            return {**data, "type": SuspensionType.TOOL_OUTCOME_UNKNOWN}
        return data

    @model_validator(mode="after")
    def _deadline_has_a_default(self) -> AgentSuspension:
        if (self.deadline is None) != (self.on_timeout is None):
            raise ValueError("deadline and on_timeout are set together")
        if self.on_timeout is None:
            return self
        if self.type is SuspensionType.TOOL_APPROVAL:
            allowed = {TimeoutAction.APPROVE, TimeoutAction.REJECT}
        elif self.type is SuspensionType.USER_INPUT and self.form is not None and self.correlation_id is not None:
            allowed = {TimeoutAction.REJECT, TimeoutAction.SUBMIT}
        else:
            raise ValueError("a deadline applies to a tool approval or a form, not to this suspension")
        if self.on_timeout not in allowed:
            raise ValueError(f"on_timeout {self.on_timeout.value!r} does not apply to a {self.type.value} suspension")
        if self.on_timeout is TimeoutAction.SUBMIT and (self.form is None or self.form.default_data is None):
            raise ValueError("on_timeout 'submit' needs a form with default_data")
        return self

    @property
    def is_outcome_unknown(self) -> bool:
        """Whether a person is asked to settle a call whose outcome is unknown (see `outcome_unknown`)."""
        return self.type is SuspensionType.TOOL_OUTCOME_UNKNOWN

    @property
    def wake_at(self) -> datetime | None:
        """When a sweep must next look at this suspension: its reminder, then its deadline (None: never)."""
        if self.deadline is None:
            return None
        if self.remind_at is not None and self.reminded_at is None and self.remind_at < self.deadline:
            return self.remind_at
        return self.deadline

    @classmethod
    def user_input(cls, message: str) -> AgentSuspension:
        """A plain-text question; the answer arrives as `AgentResumeCommand.user_input(text)`."""
        return cls(type=SuspensionType.USER_INPUT, message=message, resume_phase=Phase.MODEL)

    @classmethod
    def outcome_unknown(cls, correlation_id: str, message: str, metadata: Mapping[str, Any]) -> AgentSuspension:
        """A non-idempotent call that started and whose outcome is unknown, for a person to settle.

        `approve_tool` runs it again, `tool_result` marks it done with a result, `reject_tool`
        fails it. `metadata` (tool name, masked arguments, what is known) gets
        `reason: OUTCOME_UNKNOWN_REASON` too.
        """
        return cls(
            type=SuspensionType.TOOL_OUTCOME_UNKNOWN,
            correlation_id=correlation_id,
            message=message,
            resume_phase=Phase.TOOLS,
            metadata={"reason": OUTCOME_UNKNOWN_REASON, **metadata},
        )


class ResumeType(StrEnum):
    """Kinds of resume command."""

    USER_INPUT = "USER_INPUT"
    APPROVE_TOOL = "APPROVE_TOOL"
    REJECT_TOOL = "REJECT_TOOL"
    CHILD_COMPLETED = "CHILD_COMPLETED"
    RETRY = "RETRY"
    TOOL_RESULT = "TOOL_RESULT"
    DEADLINE = "DEADLINE"
    """The suspension's deadline passed: apply its `on_timeout` default."""
    EDIT_TOOL = "EDIT_TOOL"
    """Approve the pending call with arguments a person edited (checked against the tool's schema)."""


class AgentResumeCommand(FrozenModel):
    """An immutable instruction to continue a suspended turn. Build one with the class methods."""

    type: ResumeType
    content: str | None = None
    tool_call_id: str | None = None
    data: dict[str, Any] | None = None
    reason: str | None = None
    child_turn_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Who decided, through which channel, why; carried into the TURN_RESUMED event for audit."""

    @classmethod
    def user_input(cls, content_or_call_id: str, data: dict[str, Any] | None = None) -> AgentResumeCommand:
        """Answer a user-input suspension.

        `user_input("O-1001")` answers a plain-text question with a new user message;
        `user_input(call_id, {...})` submits form data for the pending call `call_id`.
        """
        if data is None:
            return cls(type=ResumeType.USER_INPUT, content=content_or_call_id)
        return cls(type=ResumeType.USER_INPUT, tool_call_id=content_or_call_id, data=data)

    @classmethod
    def approve_tool(cls, tool_call_id: str) -> AgentResumeCommand:
        """Approve the pending call; the saved call runs as the model made it."""
        return cls(type=ResumeType.APPROVE_TOOL, tool_call_id=tool_call_id)

    @classmethod
    def reject_tool(cls, tool_call_id: str, reason: str = "rejected by the user") -> AgentResumeCommand:
        """Reject the pending call; the model is told the reason and answers.

        For a call waiting for a form, this declines the form: a tool that takes declines
        (an MCP server's question, say) runs again and tells whoever asked; otherwise the
        model is told the user declined.
        """
        return cls(type=ResumeType.REJECT_TOOL, tool_call_id=tool_call_id, reason=reason)

    @classmethod
    def edit_tool(cls, tool_call_id: str, arguments: dict[str, Any]) -> AgentResumeCommand:
        """Approve the pending call with edited arguments.

        The saved call is replaced by the edited one (the arguments must fit the tool's
        schema) and runs; the model is not asked again. Who edited and why go in the
        metadata (`decided_by`, `reason`), as for an approval.
        """
        return cls(type=ResumeType.EDIT_TOOL, tool_call_id=tool_call_id, data=dict(arguments))

    @classmethod
    def tool_result(cls, tool_call_id: str, content: str) -> AgentResumeCommand:
        """Settle a call whose outcome is unknown as done, with the result a person found out.

        Only for a turn suspended because a non-idempotent tool started and its outcome was
        not recorded; `approve_tool` retries such a call and `reject_tool` fails it.
        """
        return cls(type=ResumeType.TOOL_RESULT, tool_call_id=tool_call_id, content=content)

    @classmethod
    def child_completed(cls, child_turn_id: str) -> AgentResumeCommand:
        """Record that a child turn ended (normally sent by the runner itself)."""
        return cls(type=ResumeType.CHILD_COMPLETED, child_turn_id=child_turn_id)

    @classmethod
    def retry(cls) -> AgentResumeCommand:
        """Retry a RETRY_SCHEDULED turn now, even before `next_retry_at`."""
        return cls(type=ResumeType.RETRY)

    @classmethod
    def deadline_passed(cls, correlation_id: str | None) -> AgentResumeCommand:
        """Apply the `on_timeout` default of the waiting call `correlation_id`, whose deadline has passed.

        Normally sent by the deadline sweep (`AgentRunner.apply_deadline`); refused before the deadline.
        """
        return cls(type=ResumeType.DEADLINE, tool_call_id=correlation_id)

    def with_metadata(self, key: str, value: Any) -> AgentResumeCommand:
        """Return a copy with one more metadata entry."""
        return self.model_copy(update={"metadata": {**self.metadata, key: value}})
