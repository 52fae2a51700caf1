"""Agents served to the console's end-to-end tests (`agent-runner serve --agents tests.browser.console_agents:AGENTS`).

`support-desk` asks for a form, asks to approve the ticket it then creates (its access
token is a sensitive argument), and streams its answer in small chunks with pauses, so a
browser sees it arrive, can reload mid-stream, and must end up with exactly `answer_for`.
`refunds` pays a refund with a non-idempotent tool; when `TEST_CRASH_DIR` is set its first
run kills the server, so a person settles the call whose outcome is unknown.
`change-desk` asks to approve a deployment that is rejected if nobody decides within the hour.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Literal

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.helpers.crash import stop_this_process_once

CHUNK_PAUSE_S = float(os.environ.get("CONSOLE_TEST_CHUNK_PAUSE_S", "0.25"))
"""Pause between streamed chunks; long enough for a page reload in the middle of an answer."""

TICKET_FORM = AgentFormDefinition(
    key="ticket_details",
    description="Ticket details",
    schema={
        "type": "object",
        "title": "Ticket details",
        "required": ["affected_system", "impact_scope", "users"],
        "properties": {
            "affected_system": {
                "type": "string",
                "title": "Affected system",
                "description": "The system that fails, as users call it.",
                "minLength": 2,
            },
            "impact_scope": {"type": "string", "title": "Impact scope", "enum": ["ONE_USER", "ALL_USERS"]},
            "users": {"type": "integer", "title": "Users affected", "minimum": 1},
            "urgent": {"type": "boolean", "title": "Urgent", "default": False},
            "tags": {"type": "array", "title": "Tags", "items": {"type": "string", "title": "Tag", "minLength": 2}},
            "contact": {
                "type": "object",
                "title": "Contact",
                "properties": {"email": {"type": "string", "title": "Email", "pattern": "^[^@]+@[^@]+$"}},
            },
        },
        "additionalProperties": False,
    },
)


@tool(requires_approval=True, sensitive=["access_token"])
def create_ticket(
    affected_system: str, impact_scope: Literal["ONE_USER", "ALL_USERS"], users: int, access_token: str
) -> str:
    """Open an incident ticket in the tracker."""
    return f"INC-{users:04d}"


def answer_for(tool_result: ToolMessage) -> str:
    """The final answer the model streams after the ticket call was decided."""
    if tool_result.is_error or not tool_result.content.startswith("INC-"):
        return f"I did not open the ticket. Reason given: {tool_result.content}"
    return (
        f"Ticket {tool_result.content} is open. "
        "The on-call engineer has been paged and will call you back within fifteen minutes. "
        "Thank you for the details."
    )


def _chunks(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def support_desk(request: ChatRequest) -> AiMessage:
    """Decide from the last message: form first, then the approval, then a streamed answer."""
    last = request.messages[-1]
    step = len(request.messages)
    if isinstance(last, UserMessage):
        return AiMessage(
            content="Let me open a ticket for that.",
            tool_calls=[
                ToolCall(id=f"form-{step}", name="request_user_input", arguments={"formKey": "ticket_details"})
            ],
        )
    if isinstance(last, ToolMessage) and last.tool_name == "request_user_input":
        data = json.loads(last.content)
        arguments = {
            "affected_system": data["affected_system"],
            "impact_scope": data["impact_scope"],
            "users": data["users"],
            "access_token": "tok-SECRET-4242",
        }
        return AiMessage(tool_calls=[ToolCall(id=f"ticket-{step}", name="create_ticket", arguments=arguments)])
    if isinstance(last, ToolMessage):
        text = answer_for(last)
        if request.on_delta is not None:
            for chunk in _chunks(text):
                request.on_delta(chunk)
                time.sleep(CHUNK_PAUSE_S)
        return AiMessage(content=text)
    return AiMessage(content="I am not sure what to do next.")


@tool(idempotent=False)
def issue_refund(order_id: str, amount: float) -> str:
    """Pay a refund back to the customer's card (running it twice pays twice)."""
    stop_this_process_once(f"refund-{order_id}")
    return f"refund of {amount:.2f} for {order_id} paid"


def refund_answer(tool_result: ToolMessage) -> str:
    """The answer of `refunds` once the refund call was settled."""
    if tool_result.is_error:
        return f"The refund did not go through: {tool_result.content}"
    return f"Done: {tool_result.content}."


def refunds(request: ChatRequest) -> AiMessage:
    """Refund the order the user names; answer with the refund's outcome."""
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=refund_answer(last))
    order_id = str(last.content).split()[-1]
    call = ToolCall(
        id=f"refund-{len(request.messages)}", name="issue_refund", arguments={"order_id": order_id, "amount": 25.0}
    )
    return AiMessage(tool_calls=[call])


@tool(requires_approval=True, approval_timeout=timedelta(hours=1), on_timeout="reject")
def deploy_change(service: str) -> str:
    """Deploy a change; rejected when nobody approves it within the hour."""
    return f"{service} deployed"


def change_desk(request: ChatRequest) -> AiMessage:
    """Ask to deploy the service the user names, then report what happened."""
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=last.content)
    call = ToolCall(id=f"deploy-{len(request.messages)}", name="deploy_change", arguments={"service": "billing"})
    return AiMessage(tool_calls=[call])


AGENTS = [
    Agent(
        id="support-desk",
        version="1",
        instructions="Open incident tickets from what users report.",
        chat_model=ScriptedChatModel(support_desk),
        tools=[AgentUserInputTool(forms=[TICKET_FORM]), create_ticket],
    ),
    Agent(
        id="echo",
        version="2",
        instructions="Repeat what the user says.",
        chat_model=ScriptedChatModel(lambda request: AiMessage(content=f"You said: {request.messages[-1].content}")),
    ),
    Agent(
        id="refunds",
        version="1",
        instructions="Refund orders.",
        chat_model=ScriptedChatModel(refunds),
        tools=[issue_refund],
    ),
    Agent(
        id="change-desk",
        version="1",
        instructions="Deploy changes once a person approves them.",
        chat_model=ScriptedChatModel(change_desk),
        tools=[deploy_change],
    ),
]
