"""Agents for the operations tests: the worker agents of `celery_agents`, plus one whose approvals time out.

`AGENT_RUNNER_AGENT_LOADER=tests.integration.celery_workers.ops_agents:build_loader`.
The deadline agent calls `timed_write` once (its approval waits `APPROVAL_TIMEOUT_S`, then
is approved by default), then answers. The side effect goes to the same ledger as the
other scenarios, keyed by the call's idempotency key, so a call that ran twice shows.
"""

from __future__ import annotations

from agent_runner import (
    Agent,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.integration.celery_workers.celery_agents import build_agents, ledger_write

APPROVAL_TIMEOUT_S = 3.0


@tool(requires_approval=True, approval_timeout=APPROVAL_TIMEOUT_S, on_timeout="approve")
def timed_write(effect: str) -> str:
    """Write one side effect to the ledger; approved by default when nobody decides in time."""
    result: str = ledger_write(effect)
    return result


class DeadlineModel:
    """Asks for `timed_write` with the user's text as the effect, then reports the tool's answer."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """One tool call, then a final answer quoting the result."""
        start = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
        opening = request.messages[start]
        assert isinstance(opening, UserMessage)
        results = [m for m in request.messages[start + 1 :] if isinstance(m, ToolMessage)]
        if not results:
            call = {"id": f"timed-{opening.id}", "name": "timed_write", "arguments": {"effect": opening.content}}
            return ChatResponse(message=AiMessage.model_validate({"tool_calls": [call]}))
        return ChatResponse(message=AiMessage(content=f"result: {results[-1].content}"))


def build_loader() -> InMemoryAgentLoader:
    """The celery test agents and the deadline agent."""
    deadline = Agent(id="deadline-agent", chat_model=DeadlineModel(), tools=[timed_write])
    return InMemoryAgentLoader([*build_agents(), deadline])
