"""Conversation messages: the four model messages and the two page messages.

Model messages (`SystemMessage`, `UserMessage`, `AiMessage`, `ToolMessage`) are what the
chat model sees. Page messages (`AgentActionMessage`, `AgentFormMessage`) live only in
`ChatMemory` for a chat page to render approval cards and forms; they are never sent to
the model. Every message has a stable `id` so that projections into memory are
idempotent. The union is discriminated by `role`; role values are persisted, so they are
never renamed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from agent_runner._base import PositionalModel
from agent_runner.ids import new_id


class ToolCall(PositionalModel):
    """A tool call the model asked for."""

    _positional: ClassVar[tuple[str, ...]] = ("id", "name", "arguments")

    id: str
    """Call id chosen by the model; it correlates the call with its `ToolMessage`."""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    if TYPE_CHECKING:

        def __init__(self, id: str, name: str, arguments: dict[str, Any] = ...) -> None: ...


class _MessageBase(PositionalModel):
    model_visible: ClassVar[bool] = True
    """Whether the message is sent to the chat model."""

    id: str = Field(default_factory=new_id)
    """Stable message id; generated when absent."""


class SystemMessage(_MessageBase):
    """Instructions for the model."""

    _positional: ClassVar[tuple[str, ...]] = ("content",)
    role: Literal["system"] = "system"
    content: str

    if TYPE_CHECKING:

        def __init__(self, content: str, *, id: str = ..., role: Literal["system"] = "system") -> None: ...


class UserMessage(_MessageBase):
    """A message typed by the user."""

    _positional: ClassVar[tuple[str, ...]] = ("content",)
    role: Literal["user"] = "user"
    content: str

    if TYPE_CHECKING:

        def __init__(self, content: str, *, id: str = ..., role: Literal["user"] = "user") -> None: ...


class ProviderPart(PositionalModel):
    """A part of a model's answer that only the provider that wrote it reads, kept verbatim.

    Anthropic's thinking blocks (with their signatures), the OpenAI Responses API's
    reasoning items (with their encrypted content) and Gemini's thought signatures must be
    sent back unchanged on the next call of the same turn. The adapter of `provider` puts
    them back where they belong; every other adapter, the page timeline and the client
    protocols ignore them.
    """

    _positional: ClassVar[tuple[str, ...]] = ("provider", "data")

    provider: str
    """The adapter's `provider` name (`"anthropic"`, `"openai_responses"`, `"gemini"`)."""
    data: dict[str, Any]
    """The part as the provider sent it (JSON), and where it goes in the message."""

    if TYPE_CHECKING:

        def __init__(self, provider: str, data: dict[str, Any]) -> None: ...


class AiMessage(_MessageBase):
    """A model response: text, tool calls, or both."""

    _positional: ClassVar[tuple[str, ...]] = ("content", "tool_calls")
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # Left out of the JSON when empty, so the messages of other models serialize as before.
    provider_parts: list[ProviderPart] = Field(default_factory=list, exclude_if=lambda parts: not parts)
    """Opaque parts its provider needs back verbatim (see `ProviderPart`); empty for most models."""

    if TYPE_CHECKING:

        def __init__(
            self,
            content: str | None = None,
            tool_calls: list[ToolCall] = ...,
            *,
            provider_parts: list[ProviderPart] = ...,
            id: str = ...,
            role: Literal["assistant"] = "assistant",
        ) -> None: ...

    def parts_of(self, provider: str) -> list[dict[str, Any]]:
        """The data of the provider parts written by `provider`, in order."""
        return [part.data for part in self.provider_parts if part.provider == provider]


class ToolMessage(_MessageBase):
    """The result of one tool call, as the model will read it."""

    _positional: ClassVar[tuple[str, ...]] = ("tool_call_id", "tool_name", "content", "is_error")
    role: Literal["tool"] = "tool"
    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool = False

    if TYPE_CHECKING:

        def __init__(
            self,
            tool_call_id: str,
            tool_name: str,
            content: str,
            is_error: bool = False,
            *,
            id: str = ...,
            role: Literal["tool"] = "tool",
        ) -> None: ...


class ActionStatus(StrEnum):
    """State of a page message's action."""

    PENDING = "PENDING"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    SUBMITTED = "SUBMITTED"
    CANCELLED = "CANCELLED"
    """Nobody decided: the turn ended (cancelled, failed, out of budget) while it was pending."""


class _PageMessageBase(_MessageBase):
    model_visible: ClassVar[bool] = False

    version: int = 0
    """Compare-and-swap version of the page message; bumped by every update."""
    turn_id: str
    action_id: str
    """The tool call id this page message stands for."""
    status: ActionStatus = ActionStatus.PENDING
    decided_by: str | None = None
    """Who decided (the resume command's `decided_by` or `approverId` metadata; `"system"` for a close-out)."""
    decided_at: datetime | None = None
    reason: str | None = None
    """Why: the rejection reason, the reason given with an approval (the resume command's `reason`
    metadata), or the reason the turn ended while the action was pending."""


class AgentActionMessage(_PageMessageBase):
    """Approval card for a tool call that waits for a person's decision."""

    _positional: ClassVar[tuple[str, ...]] = (
        "id",
        "version",
        "turn_id",
        "action_id",
        "tool_name",
        "summary",
        "status",
    )
    role: Literal["agent_action"] = "agent_action"
    tool_name: str
    summary: str
    """Human-readable description of the call; sensitive arguments are masked."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The call's arguments with sensitive values replaced by `"***"`."""
    kind: Literal["approval", "outcome_unknown"] = "approval"
    """`approval`: the call waits to run. `outcome_unknown`: a non-idempotent call started and
    its outcome was never recorded; a person retries it, marks it done with a result, or fails it."""

    def get_actions(self) -> list[str]:
        """Actions the page may offer while pending, none afterwards.

        APPROVE and REJECT for an approval; RETRY, MARK_DONE and FAIL for an unknown outcome
        (resume with `approve_tool`, `tool_result` and `reject_tool`).
        """
        if self.status is not ActionStatus.PENDING:
            return []
        return ["RETRY", "MARK_DONE", "FAIL"] if self.kind == "outcome_unknown" else ["APPROVE", "REJECT"]


class AgentFormMessage(_PageMessageBase):
    """A form the user is asked to fill in, with the full JSON Schema to render and validate."""

    _positional: ClassVar[tuple[str, ...]] = ("id", "version", "turn_id", "action_id", "form_key", "schema", "status")
    role: Literal["agent_form"] = "agent_form"
    form_key: str
    description: str = ""
    form_schema: dict[str, Any] = Field(alias="schema")

    @property
    def schema(self) -> dict[str, Any]:  # type: ignore[override]
        """The JSON Schema of the form, frozen when the turn suspended."""
        return self.form_schema

    def get_actions(self) -> list[str]:
        """Actions the page may offer: SUBMIT while pending, none afterwards."""
        return ["SUBMIT"] if self.status is ActionStatus.PENDING else []


ModelMessage = Annotated[SystemMessage | UserMessage | AiMessage | ToolMessage, Field(discriminator="role")]
"""A message the chat model can see."""

PageMessage = AgentActionMessage | AgentFormMessage
"""A message only the chat page sees."""

AnyMessage = Annotated[
    SystemMessage | UserMessage | AiMessage | ToolMessage | AgentActionMessage | AgentFormMessage,
    Field(discriminator="role"),
]
"""Any message a `ChatMemory` can hold."""

ModelMessagesAdapter: TypeAdapter[list[ModelMessage]] = TypeAdapter(list[ModelMessage])
AnyMessagesAdapter: TypeAdapter[list[AnyMessage]] = TypeAdapter(list[AnyMessage])
AnyMessageAdapter: TypeAdapter[AnyMessage] = TypeAdapter(AnyMessage)

ROLES_MODEL_VISIBLE = frozenset({"system", "user", "assistant", "tool"})
