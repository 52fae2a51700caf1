"""How the runner's objects look in the LangGraph API: messages, interrupts, statuses, inputs and resumes.

One place for the translation both ways, so the routes and the stream speak the same
dialect:

- messages are LangChain's message dicts (`type` human / ai / tool / system, `tool_calls`
  with `id`, `name`, `args`, `tool_call_id` on tool messages), tool arguments masked as
  everywhere else in the API;
- a suspension is an interrupt: a form carries its frozen JSON Schema (`response_schema`),
  a tool approval has the shape of LangChain's human-in-the-loop middleware
  (`action_requests`, `review_configs`), a plain question is its text;
- a turn's status is a run status and, with the conversation's other turns, a thread status;
- a run's input (`{"messages": [...]}`) gives the turn's user message, and a
  `command.resume` value gives the resume command of the pending interrupt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    AnyMessage,
    SuspensionType,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from agent_runner.snapshot import WAITING_FOR_A_PERSON
from store.threads import FAILED_STATUSES
from workers.api.errors import ApiError, InvalidRequestError
from workers.views import MASK, ArgumentMask, agent_mask

HUMAN_TYPES = frozenset({"human", "user"})
AI_TYPES = frozenset({"ai", "assistant"})

APPROVAL_DECISIONS = ("approve", "edit", "reject")
"""The decisions an approval interrupt allows."""


class NotSupportedError(ApiError):
    """A part of the LangGraph protocol this server does not implement (501), named in the message."""

    def __init__(self, what: str) -> None:
        super().__init__(501, f"{what} is not supported by this server", type_name="NotSupported")


# --- Messages ---------------------------------------------------------------------------------


def langchain_message(message: AnyMessage, mask: ArgumentMask) -> dict[str, Any] | None:
    """The LangChain dict of a model message; None for page messages (cards and forms), which are not state."""
    base: dict[str, Any] = {"id": message.id, "name": None, "additional_kwargs": {}, "response_metadata": {}}
    match message:
        case UserMessage():
            return {**base, "type": "human", "content": message.content}
        case SystemMessage():
            return {**base, "type": "system", "content": message.content}
        case AiMessage():
            calls = [
                {"id": call.id, "name": call.name, "args": mask(call), "type": "tool_call"}
                for call in message.tool_calls
            ]
            return {
                **base,
                "type": "ai",
                "content": message.content or "",
                "tool_calls": calls,
                "invalid_tool_calls": [],
                "usage_metadata": None,
            }
        case ToolMessage():
            return {
                **base,
                "type": "tool",
                "name": message.tool_name,
                "content": message.content,
                "tool_call_id": message.tool_call_id,
                "status": "error" if message.is_error else "success",
            }
    return None


def langchain_messages(messages: Sequence[AnyMessage], mask: ArgumentMask) -> list[dict[str, Any]]:
    """The LangChain dicts of the model messages among `messages`, in order."""
    return [m for m in (langchain_message(message, mask) for message in messages) if m is not None]


def message_chunk(message_id: str, text: str) -> dict[str, Any]:
    """A token delta as an `AIMessageChunk` dict (the `messages-tuple` stream mode)."""
    return {
        "type": "AIMessageChunk",
        "id": message_id,
        "content": text,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
        "tool_calls": [],
        "invalid_tool_calls": [],
        "tool_call_chunks": [],
    }


# --- Interrupts -------------------------------------------------------------------------------


def interrupt_of(turn: AgentTurn, agent: Agent | None) -> dict[str, Any] | None:
    """The interrupt of a turn waiting for a person (`{"id", "value"}`); None otherwise.

    The id is the suspension's correlation id (the tool call waiting), or the turn id for
    a plain question.
    """
    suspension = turn.suspension
    if suspension is None or turn.status not in WAITING_FOR_A_PERSON:
        return None
    return build_interrupt(
        turn,
        agent,
        suspension_type=suspension.type,
        correlation_id=suspension.correlation_id,
        message=suspension.message,
        form=suspension.form,
    )


def build_interrupt(
    turn: AgentTurn,
    agent: Agent | None,
    *,
    suspension_type: SuspensionType,
    correlation_id: str | None,
    message: str,
    form: AgentFormDefinition | None,
) -> dict[str, Any]:
    """The interrupt of a suspension of `turn` (the tool call concerned is looked up in its messages)."""
    interrupt_id = correlation_id or turn.id
    if suspension_type.is_tool_decision:
        calls = (c for m in turn.messages if isinstance(m, AiMessage) for c in m.tool_calls)
        call = next((c for c in calls if c.id == correlation_id), None)
        name = call.name if call is not None else ""
        args = agent_mask(agent)(call) if call is not None else {}
        tool = agent.tool(name) if agent is not None else None
        description = message or (tool.description if tool is not None else "")
        value: Any = {
            "action_requests": [{"name": name, "args": args, "description": description}],
            "review_configs": [{"action_name": name, "allowed_decisions": list(APPROVAL_DECISIONS)}],
        }
        return {"id": interrupt_id, "value": value}
    if form is not None:
        schema = form.to_dict()["schema"]
        value = {
            "type": "form",
            "form_key": form.key,
            "description": form.description,
            "message": message,
            "tool_call_id": correlation_id,
            "response_schema": schema,
        }
        return {"id": interrupt_id, "value": value, "response_schema": schema}
    return {"id": interrupt_id, "value": message}


# --- Statuses ---------------------------------------------------------------------------------


def run_status(turn: AgentTurn) -> str:
    """The run status of a turn: pending, running, interrupted (waiting for a person, or cancelled), success, error."""
    if turn.status is AgentTurnStatus.READY:
        return "pending"
    if turn.status in WAITING_FOR_A_PERSON or turn.status is AgentTurnStatus.CANCELLED:
        return "interrupted"
    if turn.status is AgentTurnStatus.COMPLETED:
        return "success"
    if turn.status in FAILED_STATUSES:
        return "error"
    return "running"


def thread_status(active: AgentTurn | None, last: AgentTurn | None) -> str:
    """A thread's status from its active turn (if any) and its newest turn: busy, interrupted, error or idle."""
    if active is not None:
        return "interrupted" if active.status in WAITING_FOR_A_PERSON else "busy"
    if last is not None and last.status in FAILED_STATUSES:
        return "error"
    return "idle"


# --- Input ------------------------------------------------------------------------------------


def _text_of(content: Any, path: str) -> str:
    """The text of a LangChain message content: a string, or a list of blocks whose text blocks are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for index, block in enumerate(content):
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                raise NotSupportedError(f"message content blocks other than text ({path}/content/{index})")
        return "".join(parts)
    raise InvalidRequestError("a message's content must be a string or a list of text blocks", path=f"{path}/content")


def _kind_of(message: Any, path: str) -> str:
    if not isinstance(message, dict):
        raise InvalidRequestError("each message must be an object with `type` (or `role`) and `content`", path=path)
    kind = message.get("type", message.get("role"))
    if not isinstance(kind, str):
        raise InvalidRequestError("a message needs `type` (human, ai, ...) or `role` (user, assistant, ...)", path=path)
    return kind


def input_text(value: Any, history: Sequence[AnyMessage]) -> str:
    """The new user message of a run's `input` (`{"messages": [...]}`): the last message, which must be the user's.

    Earlier messages of the list are checked against the end of the conversation (same
    kind and text, in order), not appended: the conversation already holds them.

    Raises:
        InvalidRequestError: The input is not a list of messages ending with a user message, or
            its earlier messages are not what the conversation holds (422).
    """
    if not isinstance(value, dict) or set(value) != {"messages"}:
        raise InvalidRequestError('input must be {"messages": [...]}', path="/input")
    messages = value["messages"]
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("input.messages must be a non-empty list of messages", path="/input/messages")
    last_path = f"/input/messages/{len(messages) - 1}"
    if _kind_of(messages[-1], last_path) not in HUMAN_TYPES:
        raise InvalidRequestError("the last message of the input must be the user's (type human)", path=last_path)
    text = _text_of(messages[-1].get("content"), last_path)
    if not text:
        raise InvalidRequestError("the user's message is empty", path=f"{last_path}/content")
    earlier = messages[:-1]
    visible = [m for m in history if isinstance(m, UserMessage | AiMessage)]
    if earlier:
        told = [(_kind_of(m, f"/input/messages/{i}"), m) for i, m in enumerate(earlier)]
        said = [(kind, _text_of(m.get("content"), f"/input/messages/{i}")) for i, (kind, m) in enumerate(told)]
        said = [(kind, text) for kind, text in said if kind in HUMAN_TYPES | AI_TYPES]
        held = [("human" if isinstance(m, UserMessage) else "ai", m.content or "") for m in visible][-len(said) :]
        normalized = [("human" if kind in HUMAN_TYPES else "ai", text) for kind, text in said]
        if len(held) < len(normalized) or held != normalized:
            raise InvalidRequestError(
                "the messages before the last one are not the thread's history; send only the new user message",
                path="/input/messages",
            )
    return text


# --- Resume -----------------------------------------------------------------------------------


def resume_command(turn: AgentTurn, agent: Agent | None, resume: Any, metadata: dict[str, Any]) -> AgentResumeCommand:
    """The resume command of a `command.resume` value for the turn's pending interrupt.

    - a form: the form data (an object), checked against the frozen schema by the runner;
    - an approval: `{"decisions": [decision]}` with `{"type": "approve"}`, `{"type":
      "reject", "message": ...}` or `{"type": "edit", "edited_action": {"name", "args"}}`
      (the arguments are checked against the tool's schema by the runner; an argument the
      interrupt showed masked and that comes back as `"***"` keeps its recorded value);
    - a plain question: the answer text.

    A value keyed by the interrupt id (`{interrupt_id: value}`) is accepted too.

    Raises:
        InvalidRequestError: The value does not fit the interrupt (422).
    """
    suspension = turn.suspension
    if suspension is None or turn.status not in WAITING_FOR_A_PERSON:
        raise ApiError(
            409,
            f"run {turn.id!r} has no pending interrupt to resume (status {turn.status.value})",
            type_name="NoPendingInterrupt",
        )
    interrupt_id = suspension.correlation_id or turn.id
    if isinstance(resume, dict) and set(resume) == {interrupt_id}:
        resume = resume[interrupt_id]
    command = _command_for(turn, agent, resume)
    for key, value in metadata.items():
        command = command.with_metadata(key, value)
    return command


def _command_for(turn: AgentTurn, agent: Agent | None, resume: Any) -> AgentResumeCommand:
    suspension = turn.suspension
    assert suspension is not None
    call_id = suspension.correlation_id
    if suspension.type.is_tool_decision:
        assert call_id is not None
        decision = _single_decision(resume)
        kind = decision.get("type")
        if kind == "approve":
            return AgentResumeCommand.approve_tool(call_id)
        if kind == "reject":
            message = decision.get("message")
            if message is not None and (not isinstance(message, str) or not message):
                raise InvalidRequestError(
                    "a reject decision's message must be a non-empty string", path="/command/resume"
                )
            return AgentResumeCommand.reject_tool(call_id, message or "rejected by the user")
        if kind == "edit":
            return AgentResumeCommand.edit_tool(call_id, _edited_arguments(turn, agent, call_id, decision))
        raise InvalidRequestError(
            f"a decision's type must be one of {', '.join(APPROVAL_DECISIONS)}, not {kind!r}",
            path="/command/resume/decisions/0/type",
        )
    if call_id is not None:
        if not isinstance(resume, dict):
            raise InvalidRequestError("a form interrupt resumes with the form data (an object)", path="/command/resume")
        return AgentResumeCommand.user_input(call_id, resume)
    if not isinstance(resume, str) or not resume:
        raise InvalidRequestError(
            "a question resumes with the answer text (a non-empty string)", path="/command/resume"
        )
    return AgentResumeCommand.user_input(resume)


def _edited_arguments(turn: AgentTurn, agent: Agent | None, call_id: str, decision: dict[str, Any]) -> dict[str, Any]:
    path = "/command/resume/decisions/0/edited_action"
    action = decision.get("edited_action")
    if not isinstance(action, dict) or not isinstance(action.get("args"), dict):
        raise InvalidRequestError('an edit decision needs edited_action {"name", "args": {...}}', path=path)
    call = next((c for c in turn.pending_tool_calls if c.id == call_id), None)
    if call is None:
        raise InvalidRequestError(f"tool call {call_id!r} is no longer pending", path=path)
    if action.get("name", call.name) != call.name:
        raise InvalidRequestError(
            f"an edit changes the arguments of {call.name!r}, not which tool is called", path=f"{path}/name"
        )
    tool = agent.tool(call.name) if agent is not None else None
    hidden = set(getattr(tool, "sensitive", ()))
    args: dict[str, Any] = action["args"]
    return {
        name: call.arguments[name] if name in hidden and value == MASK and name in call.arguments else value
        for name, value in args.items()
    }


def _single_decision(resume: Any) -> dict[str, Any]:
    decisions = resume.get("decisions") if isinstance(resume, dict) else None
    if not isinstance(decisions, list) or len(decisions) != 1 or not isinstance(decisions[0], dict):
        raise InvalidRequestError(
            'an approval resumes with {"decisions": [one decision]} (one pending tool call per interrupt)',
            path="/command/resume/decisions",
        )
    return decisions[0]
