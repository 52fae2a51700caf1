"""The agents an `agent-runner serve` process of the MCP tests serves: one MCP toolset, credentials per tenant.

The MCP server's URL comes from `MCP_TEST_URL`. The model calls the tool the user names
(`"book_trip for ann"`, `"whoami"`), then answers with what the tool said.
"""

from __future__ import annotations

import os

from agent_runner import (
    Agent,
    AgentToolContext,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runner.mcp import MCPToolset

URL_ENV = "MCP_TEST_URL"


def credentials(context: AgentToolContext) -> dict[str, str]:
    """Each tenant's own key: a turn of one tenant never calls the server with another's."""
    return {"Authorization": f"Bearer key-of-{context.tenant_id}", "X-Tenant": str(context.tenant_id)}


def answer(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=f"{'failed' if last.is_error else 'done'}: {last.content}")
    assert isinstance(last, UserMessage)
    name, _, traveller = last.content.partition(" for ")
    arguments = {"traveller": traveller} if name == "book_trip" else {}
    return AiMessage(tool_calls=[ToolCall(id=f"call-{name}", name=name, arguments=arguments)])


def build_loader() -> InMemoryAgentLoader:
    toolset = MCPToolset(os.environ[URL_ENV], headers=credentials, include=["book_trip", "whoami", "delete_record"])
    return InMemoryAgentLoader([Agent(id="travel", chat_model=ScriptedChatModel(answer), tools=[toolset])])
