"""Agents served to the client-protocol tests (`--agents tests.clients.chat_agents:build_loader`).

The model streams its text as deltas (a word at a time) and plays from the turn's last
message, so any worker can take any turn over:

- `hello <text>`: answers "Hello! You said <text>." at once;
- `story <n>`: answers with `n` words, one every `STORY_WORD_S` seconds (long enough to drop
  a connection in the middle);
- `deploy <service>`: calls `deploy` (needs approval), then answers "deployed <service>" or,
  after a rejection, "not deployed: <reason>";
- `lookup <key>`: calls `lookup`, which knows only `vpn` (any other key is an error the
  model reads), then answers "found: <result>" or "lookup failed: <error>";
- `ticket`: asks for the `ticket_details` form, then answers "ticket for <system> (<scope>)";
- `fail`: the model raises, and the turn fails;
- anything else: answers "thanks: <text>".
"""

from __future__ import annotations

import json
import time

from agent_runner import (
    Agent,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    ToolError,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.integration.api.api_agents import TICKET_FORM

STORY_WORD_S = 0.15


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service to production."""
    return f"deployed {service}"


@tool
def lookup(key: str) -> str:
    """Look a system up in the inventory."""
    if key != "vpn":
        raise ToolError(f"no system called {key!r}")
    return "vpn: 3 gateways"


def _stream(request: ChatRequest, text: str, pause: float = 0.0) -> AiMessage:
    words = text.split(" ")
    for index, word in enumerate(words):
        if request.on_delta is not None:
            request.on_delta(word if index == 0 else f" {word}")
        if pause:
            time.sleep(pause)
    return AiMessage(content=text)


def _answer(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    call_id = f"call-{len(request.messages)}"
    if isinstance(last, ToolMessage):
        if last.tool_name == "deploy":
            return _stream(request, f"not deployed: {last.content}" if last.is_error else last.content)
        if last.tool_name == "lookup":
            return _stream(request, f"lookup failed: {last.content}" if last.is_error else f"found: {last.content}")
        if last.tool_name == "request_user_input":
            data = json.loads(last.content)
            return _stream(request, f"ticket for {data['system']} ({data['scope']})")
        return _stream(request, f"done: {last.content}")
    assert isinstance(last, UserMessage), last
    text = last.content
    if text.startswith("story "):
        count = int(text.split()[1])
        return _stream(request, " ".join(f"word{n}" for n in range(1, count + 1)), STORY_WORD_S)
    if text.startswith("deploy "):
        service = text.removeprefix("deploy ")
        return AiMessage(tool_calls=[ToolCall(id=call_id, name="deploy", arguments={"service": service})])
    if text.startswith("lookup "):
        key = text.removeprefix("lookup ")
        return AiMessage(tool_calls=[ToolCall(id=call_id, name="lookup", arguments={"key": key})])
    if text == "ticket":
        call = ToolCall(id=call_id, name="request_user_input", arguments={"formKey": TICKET_FORM.key})
        return AiMessage(content="I need the details.", tool_calls=[call])
    if text == "fail":
        raise ValueError("the model broke down")
    if text.startswith("hello "):
        return _stream(request, f"Hello! You said {text.removeprefix('hello ')}.")
    return _stream(request, f"thanks: {text}")


def build_agents() -> list[Agent]:
    """The `assistant` agent."""
    return [
        Agent(
            id="assistant",
            version="1",
            instructions="Help; ask for approval before deploying.",
            chat_model=ScriptedChatModel(_answer),
            tools=[AgentUserInputTool(forms=[TICKET_FORM]), deploy, lookup],
        )
    ]


def build_loader() -> InMemoryAgentLoader:
    """Entry point of `--agents tests.clients.chat_agents:build_loader`."""
    return InMemoryAgentLoader(build_agents())
