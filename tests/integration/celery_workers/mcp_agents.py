"""Agents of the Celery MCP tests: one MCP toolset (its URL in `MCP_TEST_URL`), a model that names the tool to call.

The user's text is a JSON object `{"tool": name, "arguments": {...}}`; after the tool's
answer the model answers with it.
"""

from __future__ import annotations

import json
import os

from agent_runner import (
    Agent,
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


def answer(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=f"{'failed' if last.is_error else 'done'}: {last.content}")
    assert isinstance(last, UserMessage)
    asked = json.loads(last.content)
    return AiMessage(tool_calls=[ToolCall(id="call-1", name=asked["tool"], arguments=asked["arguments"])])


def build_loader() -> InMemoryAgentLoader:
    toolset = MCPToolset(os.environ[URL_ENV], include=["delete_record", "book_trip", "long_job"], timeout=20)
    return InMemoryAgentLoader([Agent(id="mcp-agent", chat_model=ScriptedChatModel(answer), tools=[toolset])])
