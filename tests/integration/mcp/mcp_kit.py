"""Shared pieces of the MCP toolset tests: a model that calls given tools, agents and runners."""

from __future__ import annotations

from typing import Any

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurn,
    AgentTurnStore,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    RetryPolicy,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
)
from agent_runner.mcp import MCPToolset


class Model:
    """Calls the tools it is given, one response each, then answers with what the last tool said."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.calls = list(calls)
        self.requests: list[ChatRequest] = []

    def __call__(self, request: ChatRequest) -> AiMessage:
        self.requests.append(request)
        if self.calls:
            name, arguments = self.calls.pop(0)
            number = sum(1 for m in request.messages if isinstance(m, AiMessage) and m.tool_calls) + 1
            return AiMessage(tool_calls=[ToolCall(id=f"call-{number}", name=name, arguments=arguments)])
        last = next(m for m in reversed(request.messages) if isinstance(m, ToolMessage))
        return AiMessage(content=f"done: {last.content}")


def agent_with(model: Model, *toolsets: MCPToolset, agent_id: str = "mcp-agent") -> Agent:
    return Agent(id=agent_id, chat_model=ScriptedChatModel(model), tools=list(toolsets))


def tool_results(turn: AgentTurn) -> list[ToolMessage]:
    return [m for m in turn.messages if isinstance(m, ToolMessage)]


def runner_for(*agents: Agent, store: AgentTurnStore | None = None) -> AgentRunner:
    policy = AgentExecutionPolicy(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=0.0))
    return AgentRunner(
        turn_store=store or InMemoryAgentTurnStore(), agent_loader=InMemoryAgentLoader(agents), policy=policy
    )
