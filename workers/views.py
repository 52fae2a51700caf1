"""JSON views of turns and messages, resume commands and error categories, shared by the command line and the HTTP API.

Everything a person or a client sees of a turn goes through these views, so both front
ends show the same fields and mask the same arguments: a tool argument marked sensitive
(`@tool(sensitive=[...])`) is shown as `"***"`, and when the turn's agent is not known
here every argument is, since nothing says which ones are safe.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from agent_runner import (
    Agent,
    AgentConversationBusyException,
    AgentLoader,
    AgentNotFound,
    AgentResumeCommand,
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    AnyMessage,
    InputLimitError,
    InvalidEventQueryError,
    InvalidResumeCommand,
    InvalidTransitionError,
    SteeringRefusedError,
    ToolCall,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.event_payloads import suspension_kind

MASK = "***"
"""What a masked argument value is shown as."""

ConversationDisplay = Callable[[AgentTurn], str | None]
"""How a view names a turn's conversation (the HTTP API: the id its tenant knows)."""


def _own_id(turn: AgentTurn) -> str | None:
    return turn.conversation_id


def qualified_conversation(turn: AgentTurn) -> str | None:
    """A turn's conversation as the command line names it: `<tenant>/<id>` for a tenant's, else its id."""
    if turn.conversation_id is None or turn.tenant_id is None:
        return turn.conversation_id
    return f"{turn.tenant_id}/{turn.conversation_id}"


# --- Masking ----------------------------------------------------------------------------------


def find_agent(loader: AgentLoader, turn: AgentTurn) -> Agent | None:
    """The turn's agent from `loader`, or None when this process does not know it."""
    try:
        return loader.load(turn.agent_id, turn.agent_version)
    except AgentNotFound:
        return None


def masked_arguments(agent: Agent | None, call: ToolCall) -> dict[str, Any]:
    """The call's arguments as they may be shown: sensitive values replaced by `"***"`.

    With no agent every value is masked. A call of a tool the agent does not have (the
    model made the name up) or of a sub-agent has nothing marked sensitive.
    """
    if agent is None:
        return {name: MASK for name in call.arguments}
    return agent.masked_arguments(call)


ArgumentMask = Callable[[ToolCall], dict[str, Any]]
"""Returns the arguments of a call as they may be shown."""


def agent_mask(agent: Agent | None) -> ArgumentMask:
    """The mask of one agent's calls (every value masked when the agent is unknown)."""
    return lambda call: masked_arguments(agent, call)


def catalog_mask(loader: AgentLoader) -> ArgumentMask:
    """A mask for calls whose agent is not known, such as those in a conversation's history.

    An argument is masked when any agent the loader lists marks it sensitive on a tool of
    that name; every argument of a tool no listed agent has is masked.
    """
    lister = getattr(loader, "agents", None)
    sensitive: dict[str, set[str]] = {}
    for agent in lister() if callable(lister) else []:
        for tool in agent.tools:
            sensitive.setdefault(tool.name, set()).update(tool.sensitive)
        for sub in agent.sub_agents:
            sensitive.setdefault(sub.id, set())

    def mask(call: ToolCall) -> dict[str, Any]:
        names = sensitive.get(call.name)
        if names is None:
            return {name: MASK for name in call.arguments}
        return {k: (MASK if k in names else v) for k, v in call.arguments.items()}

    return mask


def tool_call_view(mask: ArgumentMask, call: ToolCall) -> dict[str, Any]:
    """`{"id", "name", "arguments"}` with the arguments masked."""
    return {"id": call.id, "name": call.name, "arguments": mask(call)}


def message_view(mask: ArgumentMask, message: AnyMessage) -> dict[str, Any]:
    """The JSON of a model or page message, with the arguments of its tool calls masked.

    Page messages already hold masked arguments (they were masked when the card was made).
    """
    # A provider's opaque parts (signed thinking, encrypted reasoning) are for that provider only.
    data = message.model_dump(mode="json", exclude={"provider_parts"})
    if isinstance(message, AiMessage) and message.tool_calls:
        data["tool_calls"] = [tool_call_view(mask, call) for call in message.tool_calls]
    return data


# --- Turns ------------------------------------------------------------------------------------


def suspension_view(turn: AgentTurn, agent: Agent | None) -> dict[str, Any] | None:
    """What the turn waits for: type, correlation id, message, form, the tool call concerned, and its deadline.

    `kind` is that of the action card of a suspension about a tool call: `approval` for
    TOOL_APPROVAL (the call waits to run), `outcome_unknown` for TOOL_OUTCOME_UNKNOWN (it
    started and its outcome is unknown); None for the other suspensions. `deadline` (ISO 8601, or None) is when `on_timeout`
    (`"approve"`, `"reject"` or `"submit"`) is applied if nobody decided.
    """
    suspension = turn.suspension
    if suspension is None:
        return None
    call = next((c for c in turn.pending_tool_calls if c.id == suspension.correlation_id), None)
    return {
        "type": suspension.type.value,
        "kind": suspension_kind(suspension),
        "correlation_id": suspension.correlation_id,
        "message": suspension.message,
        "form": None if suspension.form is None else suspension.form.to_dict(),
        "tool_call": None if call is None else tool_call_view(agent_mask(agent), call),
        "deadline": None if suspension.deadline is None else suspension.deadline.isoformat(),
        "on_timeout": None if suspension.on_timeout is None else suspension.on_timeout.value,
    }


def shown_error(turn: AgentTurn) -> str | None:
    """The turn's error; while RETRY_SCHEDULED, the error of the attempt that is retried."""
    suspension = turn.suspension
    if turn.status is AgentTurnStatus.RETRY_SCHEDULED and suspension is not None and turn.error is None:
        error = suspension.metadata.get("error")
        return error if isinstance(error, str) else None
    return turn.error


def decisions_view(turn: AgentTurn) -> list[dict[str, Any]]:
    """The turn's approval cards and forms: what each stands for, its status, and who decided, when and why.

    `decided_by` is the deciding person (from the resume command's metadata) or
    `"system"` (a deadline's default, or the turn ending while the action was pending).
    """
    views: list[dict[str, Any]] = []
    for action in turn.page_actions:
        decision = action.decision
        views.append(
            {
                "action_id": action.action_id,
                "kind": action.kind,
                "tool_name": action.payload.get("tool_name"),
                "form_key": action.payload.get("form_key"),
                "status": action.status.value,
                "decided_by": decision.get("decided_by"),
                "decided_at": decision.get("decided_at"),
                "reason": decision.get("reason"),
            }
        )
    return views


def turn_view(
    turn: AgentTurn,
    agent: Agent | None,
    *,
    messages: bool = False,
    show_conversation: ConversationDisplay = _own_id,
) -> dict[str, Any]:
    """The JSON view of a turn (the HTTP API's turn view; `agent-runner --json turns show`).

    Args:
        turn: The snapshot.
        agent: Its agent, to mask sensitive arguments (None masks every argument).
        messages: Include the turn's messages.
        show_conversation: Names the turn's conversation (default: its id).
    """
    mask = agent_mask(agent)
    view: dict[str, Any] = {
        "id": turn.id,
        "agent_id": turn.agent_id,
        "agent_version": turn.agent_version,
        "conversation_id": show_conversation(turn),
        "parent_turn_id": turn.parent_turn_id,
        "root_turn_id": turn.root_turn_id,
        "status": turn.status.value,
        "phase": turn.phase.value,
        "suspension": suspension_view(turn, agent),
        "pending_tool_calls": [tool_call_view(mask, call) for call in turn.pending_tool_calls],
        "final_output": turn.final_output,
        "error": shown_error(turn),
        "usage": turn.usage.model_dump(mode="json"),
        "model_iterations": turn.model_iterations,
        "steps": turn.steps,
        "attempt": turn.attempt,
        # A READY turn keeps its delayed start in the same column; it is shown as `starts_at`.
        "next_retry_at": None if turn.next_retry_at is None or turn.starts_at else turn.next_retry_at.isoformat(),
        "starts_at": None if turn.starts_at is None else turn.starts_at.isoformat(),
        "cancel_requested": turn.cancel_requested,
        "metadata": turn.metadata,
        "created_at": turn.created_at.isoformat(),
        "updated_at": turn.updated_at.isoformat(),
        "version": turn.version,
    }
    if messages:
        view["messages"] = [message_view(mask, message) for message in turn.messages]
    return view


def turn_summary(turn: AgentTurn) -> dict[str, Any]:
    """The short view of a turn in lists: ids, status, progress and last change."""
    return {
        "id": turn.id,
        "agent_id": turn.agent_id,
        "status": turn.status.value,
        "phase": turn.phase.value,
        "conversation_id": qualified_conversation(turn),
        "parent_turn_id": turn.parent_turn_id,
        "version": turn.version,
        "steps": turn.steps,
        "updated_at": turn.updated_at.isoformat(),
    }


def history_view(turn: AgentTurn) -> list[dict[str, Any]]:
    """The turn's messages for a terminal: role, text, tool names; never tool arguments."""
    history: list[dict[str, Any]] = []
    for message in turn.messages:
        item: dict[str, Any] = {"role": message.role}
        content = getattr(message, "content", None)
        if content is not None:
            item["content"] = content
        if message.role == "assistant" and message.tool_calls:
            item["tool_calls"] = [c.name for c in message.tool_calls]
        if message.role == "tool":
            item["tool_name"] = message.tool_name
            item["is_error"] = message.is_error
        history.append(item)
    return history


# --- Resume commands --------------------------------------------------------------------------


class ResumeAction(StrEnum):
    """What a person does to a waiting turn, as the command line and the HTTP API name it."""

    APPROVE = "approve"
    REJECT = "reject"
    INPUT = "input"
    FORM = "form"
    RETRY = "retry"
    TOOL_RESULT = "tool_result"
    """Settle a call whose outcome is unknown as done, with the result a person found out."""


class ResumeRequestError(AgentRunnerError):
    """A resume request that does not name what its action needs (or names what it cannot use)."""


_ACTION_FIELDS: dict[ResumeAction, tuple[frozenset[str], frozenset[str]]] = {
    # action: (required, allowed besides the required ones)
    ResumeAction.APPROVE: (frozenset({"tool_call_id"}), frozenset({"reason"})),
    ResumeAction.REJECT: (frozenset({"tool_call_id"}), frozenset({"reason"})),
    ResumeAction.INPUT: (frozenset({"content"}), frozenset()),
    ResumeAction.FORM: (frozenset({"tool_call_id", "data"}), frozenset()),
    ResumeAction.RETRY: (frozenset(), frozenset()),
    ResumeAction.TOOL_RESULT: (frozenset({"tool_call_id", "content"}), frozenset({"reason"})),
}

DEFAULT_REJECT_REASON = "rejected by the user"


def resume_command(
    action: ResumeAction,
    *,
    tool_call_id: str | None = None,
    content: str | None = None,
    data: dict[str, Any] | None = None,
    reason: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> AgentResumeCommand:
    """Build the resume command of `action` from the fields it needs.

    `approve`, `reject`, `form` and `tool_result` name the tool call; `input` answers a
    plain-text question with `content`; `form` submits `data`; `tool_result` gives the
    result of a call whose outcome was unknown as `content`. `reject` may give a `reason`
    (the model reads it); so may `approve` and `tool_result`, whose reason is recorded with
    the decision as the command's `reason` metadata.

    Raises:
        ResumeRequestError: A field the action needs is missing, or one it does not use is given.
    """
    given = {
        name
        for name, value in (("tool_call_id", tool_call_id), ("content", content), ("data", data), ("reason", reason))
        if value is not None
    }
    required, optional = _ACTION_FIELDS[action]
    missing = sorted(required - given)
    extra = sorted(given - required - optional)
    if missing:
        raise ResumeRequestError(f"action {action.value!r} needs {', '.join(missing)}")
    if extra:
        raise ResumeRequestError(f"action {action.value!r} does not take {', '.join(extra)}")
    match action:
        case ResumeAction.APPROVE:
            command = AgentResumeCommand.approve_tool(str(tool_call_id))
        case ResumeAction.REJECT:
            command = AgentResumeCommand.reject_tool(str(tool_call_id), reason or DEFAULT_REJECT_REASON)
        case ResumeAction.INPUT:
            command = AgentResumeCommand.user_input(str(content))
        case ResumeAction.FORM:
            command = AgentResumeCommand.user_input(str(tool_call_id), dict(data or {}))
        case ResumeAction.RETRY:
            command = AgentResumeCommand.retry()
        case ResumeAction.TOOL_RESULT:
            command = AgentResumeCommand.tool_result(str(tool_call_id), str(content))
    for key, value in (metadata or {}).items():
        command = command.with_metadata(key, value)
    if reason is not None and action is not ResumeAction.REJECT:
        command = command.with_metadata("reason", reason)
    return command


# --- Errors -----------------------------------------------------------------------------------


class ErrorKind(StrEnum):
    """How a front end should answer an error of the runner."""

    NOT_FOUND = "not-found"
    """An unknown turn or agent."""
    INVALID = "invalid"
    """Malformed input, including form data that fails its schema."""
    CONFLICT = "conflict"
    """A command that does not fit the turn (stale, duplicate, wrong type, finished), or a busy conversation."""
    UNAVAILABLE = "unavailable"
    """A database or Redis that did not answer; the same request may succeed later."""
    INTERNAL = "internal"
    """A misconfiguration or a bug."""


def classify_error(error: BaseException) -> ErrorKind:
    """The kind of answer `error` calls for."""
    if isinstance(error, TurnNotFound | AgentNotFound):
        return ErrorKind.NOT_FOUND
    if isinstance(error, InvalidResumeCommand):
        return ErrorKind.INVALID if error.errors else ErrorKind.CONFLICT
    if isinstance(error, ResumeRequestError | InvalidEventQueryError | InputLimitError):
        return ErrorKind.INVALID
    if isinstance(
        error, AgentConversationBusyException | InvalidTransitionError | VersionConflictError | SteeringRefusedError
    ):
        return ErrorKind.CONFLICT
    if isinstance(error, AgentRunnerError) and error.retryable:
        return ErrorKind.UNAVAILABLE
    return ErrorKind.INTERNAL


def schema_error_details(error: InvalidResumeCommand) -> list[dict[str, str]]:
    """The schema errors of rejected form data as `[{"path": "/field", "message": "..."}]`."""
    return [
        {"path": getattr(item, "pointer", ""), "message": getattr(item, "message", str(item))} for item in error.errors
    ]
