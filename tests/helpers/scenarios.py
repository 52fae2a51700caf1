"""Scripted models and tools that several test folders play their scenarios with.

The models answer from what the turn has seen so far (never from a count of their own
calls), so a turn taken over by another process, or restored from the store, goes on
where it was. The worker processes the integration tests start import this module too.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from agent_runner import AiMessage, AnyMessage, ChatRequest, ScriptedChatModel, ToolCall, ToolMessage, UserMessage, tool


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def fresh_call(name: str, **arguments: Any) -> ToolCall:
    """A call of `name` with a random id, as a real model makes: asked for again after a crash, it gets a new key."""
    return ToolCall(id=f"call-{uuid.uuid4().hex[:12]}", name=name, arguments=arguments)


@dataclass(frozen=True)
class Opening:
    """The turn's last user message (a scenario's script) and the messages that came after it."""

    text: str
    since: list[AnyMessage]

    @property
    def responses(self) -> int:
        """How many model responses the turn already has since the opening message."""
        return sum(1 for m in self.since if isinstance(m, AiMessage))

    @property
    def results(self) -> list[ToolMessage]:
        """The tool results since the opening message, in order."""
        return [m for m in self.since if isinstance(m, ToolMessage)]


def opening(request: ChatRequest) -> Opening:
    """Where the turn of `request` stands: its newest user message and what followed.

    In a conversation the history holds earlier turns too; only what follows the newest
    user message belongs to this turn.
    """
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    first = messages[start]
    assert isinstance(first, UserMessage)
    return Opening(first.content, list(messages[start + 1 :]))


def looping_model(tool_name: str, calls: int = 2) -> ScriptedChatModel:
    """A model that calls `tool_name` `calls` times, one call per response, then answers."""

    def respond(request: ChatRequest) -> AiMessage:
        done = len(opening(request).results)
        if done < calls:
            return AiMessage(tool_calls=[ToolCall(id=f"call-{done}", name=tool_name, arguments={"n": done})])
        return AiMessage(content=f"finished after {done} tool calls")

    return ScriptedChatModel(respond)
