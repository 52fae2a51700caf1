"""Agents served by the HTTP API test servers (`--agents api_agents:build_loader`).

The scripted model plays from the turn's last user message, so any process can take any
turn over at any point:

- `ticket ...`: asks for the `ticket_details` form, then calls `open_ticket` (needs
  approval; its `api_token` argument is sensitive), then answers "opened <ticket>" (or
  "not opened: <reason>" after a rejection);
- `sleep <seconds>`: calls `pause` (no approval), which sleeps, then answers "paused";
- `delegate <task>`: hands the task to the `helper` sub-agent, then answers with its output;
- `refund <order>`: calls `refund` (not idempotent; the first run kills the server when
  `TEST_CRASH_DIR` is set), then answers "refund: <result>" (or "refund failed: <reason>");
- `fail <why>`: the model raises, which fails the turn;
- anything else: answers "echo: <text>" at once.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.helpers.crash import stop_this_process_once

SECRET_TOKEN = "s3cr3t-token-value"

TICKET_FORM = AgentFormDefinition(
    key="ticket_details",
    description="What the ticket is about.",
    schema={
        "type": "object",
        "properties": {
            "system": {"type": "string", "minLength": 2},
            "scope": {"type": "string", "enum": ["ONE_USER", "ALL_USERS"]},
        },
        "required": ["system", "scope"],
        "additionalProperties": False,
    },
)


@tool(requires_approval=True, sensitive=["api_token"])
def open_ticket(system: str, scope: Literal["ONE_USER", "ALL_USERS"], api_token: str) -> str:
    """Open a ticket in the ticketing system."""
    return f"TICKET-{system}-{scope}"


@tool
def pause(seconds: float) -> str:
    """Wait, like a slow external call."""
    time.sleep(seconds)
    return "paused"


@tool(idempotent=False)
def refund(order_id: str) -> str:
    """Pay a refund back (running it twice pays twice)."""
    stop_this_process_once(f"refund-{order_id}")
    return f"refunded {order_id}"


def _answer(request: ChatRequest) -> AiMessage:
    messages = request.messages
    last = messages[-1]
    call_id = f"call-{len(messages)}"
    if isinstance(last, ToolMessage):
        if last.tool_name == "request_user_input":
            data = json.loads(last.content)
            arguments = {"system": data["system"], "scope": data["scope"], "api_token": SECRET_TOKEN}
            return AiMessage(tool_calls=[ToolCall(id=call_id, name="open_ticket", arguments=arguments)])
        if last.tool_name == "open_ticket":
            return AiMessage(content=f"not opened: {last.content}" if last.is_error else f"opened {last.content}")
        if last.tool_name == "pause":
            return AiMessage(content="paused")
        if last.tool_name == "refund":
            return AiMessage(content=f"refund failed: {last.content}" if last.is_error else f"refund: {last.content}")
        return AiMessage(content=f"helper said: {last.content}")
    assert isinstance(last, UserMessage), last
    text = last.content
    if text.startswith("ticket"):
        return AiMessage(
            content="I need the details.",
            tool_calls=[ToolCall(id=call_id, name="request_user_input", arguments={"formKey": TICKET_FORM.key})],
        )
    if text.startswith("sleep "):
        return AiMessage(tool_calls=[ToolCall(id=call_id, name="pause", arguments={"seconds": float(text.split()[1])})])
    if text.startswith("refund "):
        order = text.removeprefix("refund ")
        return AiMessage(tool_calls=[ToolCall(id=call_id, name="refund", arguments={"order_id": order})])
    if text.startswith("fail "):
        raise ValueError(text.removeprefix("fail "))
    if text.startswith("delegate "):
        return AiMessage(
            tool_calls=[ToolCall(id=call_id, name="helper", arguments={"task": text.removeprefix("delegate ")})]
        )
    return AiMessage(content=f"echo: {text}")


def build_agents() -> list[Agent]:
    """The `desk` agent (with its `helper` sub-agent)."""
    model = ScriptedChatModel(_answer)
    helper = Agent(id="helper", description="Does a small task.", chat_model=model)
    desk = Agent(
        id="desk",
        version="2",
        instructions="Open tickets; ask for details with the form.",
        chat_model=model,
        tools=[AgentUserInputTool(forms=[TICKET_FORM]), open_ticket, pause, refund],
        sub_agents=[helper],
    )
    return [desk]


def build_loader() -> InMemoryAgentLoader:
    """Entry point of `--agents api_agents:build_loader`."""
    return InMemoryAgentLoader(build_agents())
