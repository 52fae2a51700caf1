"""The agent that `agent-runner serve` and Celery workers of the MCP tests run: one MCP toolset, credentials per tenant.

The MCP server's URL comes from `MCP_TEST_URL`. The user's text is `ask(tool, **arguments)`
(a JSON object); the model calls that tool (call id `call-1`), then answers with what it said.
"""

from __future__ import annotations

import json
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
LOADER = "tests.helpers.mcp_agents:build_loader"


def ask(tool: str, **arguments: object) -> str:
    """The user's text that makes the model call `tool` with `arguments`."""
    return json.dumps({"tool": tool, "arguments": arguments})


def credentials(context: AgentToolContext) -> dict[str, str]:
    """Each tenant's own key: a turn of one tenant never calls the server with another's."""
    return {"Authorization": f"Bearer key-of-{context.tenant_id}", "X-Tenant": str(context.tenant_id)}


def answer(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=f"{'failed' if last.is_error else 'done'}: {last.content}")
    assert isinstance(last, UserMessage)
    asked = json.loads(last.content)
    return AiMessage(tool_calls=[ToolCall(id="call-1", name=asked["tool"], arguments=asked["arguments"])])


def build_loader() -> InMemoryAgentLoader:
    tools = ["book_trip", "link_account", "whoami", "delete_record", "long_job"]
    toolset = MCPToolset(os.environ[URL_ENV], headers=credentials, include=tools, timeout=20)
    return InMemoryAgentLoader([Agent(id="mcp-agent", chat_model=ScriptedChatModel(answer), tools=[toolset])])
