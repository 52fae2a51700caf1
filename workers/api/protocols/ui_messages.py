"""A conversation as AI SDK UI messages: what `useChat({messages})` takes to show it again after a reload.

`GET /v1/agents/{agent_id}/ai-sdk/chat/{chat_id}/messages` answers with these. They are
made from the conversation's timeline (the messages and page messages that
`GET /v1/conversations/{id}/messages` lists, read by `service.conversation_messages`), in
the shapes the UI message stream (`workers.api.protocols.ai_sdk`) gives the same things:

- each user message is a user message with one text part;
- what follows it, up to the next user message, is one assistant message: a `step-start`
  part per model response, its text, and a tool part per call (`tool-<name>`) in its
  current state: `approval-requested` while an approval card waits, `approval-responded`
  once approved and not run yet, `output-available` / `output-error` with the result,
  `output-denied` after a rejection; a call waiting for a form is `input-available`,
  followed by the `data-form` part the stream sent; a plain-text question the turn waits
  for is a `data-question` part.

Ids are stable: a user message keeps its stored id, and an assistant message takes the id
the stream gives its turn's message (the turn id) when the timeline tells the turn (its
approval cards and forms name it, and the conversation's active turn is the last one), else
the id of its first message. The active turn's message matching the stream is what lets
`useChat({messages, resume: true})` replace it when the resumed stream replays the turn,
instead of showing it twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_runner import (
    ActionStatus,
    AgentActionMessage,
    AgentFormMessage,
    AgentTurn,
    AiMessage,
    AnyMessage,
    SuspensionType,
    ToolMessage,
    UserMessage,
)
from workers.views import ArgumentMask

UNDECIDED_ERROR = "nobody decided before the turn ended"
"""The error shown on a call whose approval or form the turn ended without (when no reason was recorded)."""


def tool_output(content: str) -> Any:
    """A tool's result as the JSON it encodes, or as the text it is."""
    try:
        return json.loads(content)
    except ValueError:
        return content


@dataclass
class _Group:
    """The messages between two user messages: one assistant message of `useChat`."""

    messages: list[AnyMessage] = field(default_factory=list)
    after_user: str | None = None
    """The id of the user message before the group (None: the page starts with the group)."""

    def turn_id(self) -> str | None:
        """The turn the group's approval cards and forms belong to, if it has any."""
        for message in self.messages:
            if isinstance(message, AgentActionMessage | AgentFormMessage):
                return message.turn_id
        return None


def ui_messages(
    messages: Sequence[AnyMessage], mask: ArgumentMask, *, active: AgentTurn | None, conversation_id: str | None
) -> list[dict[str, Any]]:
    """The timeline `messages` (oldest first) as UI messages, oldest first.

    Args:
        messages: The conversation's messages and page messages, as the timeline lists them.
        mask: Shows a call's arguments (page messages hold masked arguments already).
        active: The conversation's active turn of the agent, if any. The last assistant
            message belongs to it when the user message before it is one of the turn's;
            that message then shows what the turn waits for.
        conversation_id: The conversation as the client knows it (in the messages' metadata).
    """
    out: list[dict[str, Any] | _Group] = []
    last_user: str | None = None
    for message in messages:
        if isinstance(message, UserMessage):
            last_user = message.id
            out.append({"id": message.id, "role": "user", "parts": [{"type": "text", "text": message.content}]})
            continue
        group = out[-1] if out and isinstance(out[-1], _Group) else None
        if group is None:
            group = _Group(after_user=last_user)
            out.append(group)
        group.messages.append(message)
    active_ids = set() if active is None else {m.id for m in active.messages}
    claimed: set[str] = set()
    shown: list[dict[str, Any]] = []
    # From the newest: a turn whose messages a user's answer split in two names its last part,
    # the one its stream continues.
    for item in reversed(out):
        if not isinstance(item, _Group):
            shown.append(item)
            continue
        turn_id = item.turn_id()
        waits_on = None
        if active is not None and item is out[-1] and item.after_user in active_ids:
            turn_id, waits_on = active.id, active
        if turn_id is not None and turn_id in claimed:
            turn_id = None
        if turn_id is not None:
            claimed.add(turn_id)
        shown.append(_assistant(item, mask, turn_id, waits_on, conversation_id))
    shown.reverse()
    return [m for m in shown if m["parts"]]


def _assistant(
    group: _Group, mask: ArgumentMask, turn_id: str | None, active: AgentTurn | None, conversation_id: str | None
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    results: dict[str, ToolMessage] = {}
    cards: dict[str, AgentActionMessage | AgentFormMessage] = {}
    for message in group.messages:
        if isinstance(message, AiMessage):
            parts.append({"type": "step-start"})
            if message.content:
                parts.append({"type": "text", "text": message.content, "state": "done"})
            for call in message.tool_calls:
                part = {"type": f"tool-{call.name}", "toolCallId": call.id, "state": "input-available"}
                calls[call.id] = part | {"input": mask(call)}
                parts.append(calls[call.id])
        elif isinstance(message, ToolMessage):
            results[message.tool_call_id] = message
        elif isinstance(message, AgentActionMessage | AgentFormMessage):
            cards[message.action_id] = message
    waiting = None if active is None else active.suspension
    for call_id, part in calls.items():
        card = cards.get(call_id)
        part.update(_call_state(call_id, card, results.get(call_id)))
        if isinstance(card, AgentFormMessage) and card.status is ActionStatus.PENDING:
            asked = waiting.message if waiting is not None and waiting.correlation_id == call_id else ""
            form = {"toolCallId": call_id, "key": card.form_key, "description": card.description}
            parts.append({"type": "data-form", "id": call_id, "data": form | {"schema": card.schema, "message": asked}})
    if (
        waiting is not None
        and waiting.type is SuspensionType.USER_INPUT
        and waiting.correlation_id is None
        and waiting.form is None
    ):
        parts.append({"type": "data-question", "data": {"message": waiting.message}})
    first = group.messages[0].id
    ui: dict[str, Any] = {"id": turn_id or first, "role": "assistant", "parts": parts}
    if turn_id is not None:
        ui["metadata"] = {"turnId": turn_id, "conversationId": conversation_id}
    return ui


def _call_state(
    call_id: str, card: AgentActionMessage | AgentFormMessage | None, result: ToolMessage | None
) -> dict[str, Any]:
    """The fields of a tool part that say where the call stands, from its card (if any) and its result (if any)."""
    approval: dict[str, Any] | None = None
    if isinstance(card, AgentActionMessage):
        if card.status is ActionStatus.PENDING:
            # No `requestReason`: `ai` 7 would send it back, and that tells its requests from `ai` 6's.
            return {"state": "approval-requested", "approval": {"id": call_id}}
        if card.status in (ActionStatus.APPROVED, ActionStatus.REJECTED):
            approval = {"id": call_id, "approved": card.status is ActionStatus.APPROVED}
            if card.reason:
                approval["reason"] = card.reason
        if card.status is ActionStatus.REJECTED:
            return {"state": "output-denied", "approval": approval}
    decided = {} if approval is None else {"approval": approval}
    if result is None:
        if card is not None and card.status is ActionStatus.CANCELLED:
            return {"state": "output-error", "errorText": card.reason or UNDECIDED_ERROR}
        return {"state": "approval-responded", **decided} if approval is not None else {}
    if result.is_error:
        return {"state": "output-error", "errorText": result.content, **decided}
    return {"state": "output-available", "output": tool_output(result.content), **decided}
