"""Agents of the LangGraph API tests (`--agents tests.integration.langgraph.langgraph_agents:build_loader`).

The `desk` agent of the HTTP API tests (forms, approvals, sleeps, sub-agents) and `writer`,
whose model streams its answer word by word as deltas: `story <n>` answers the words
`w1 ... w<n>`, one delta per word with a short pause, so a client can drop and reconnect
mid-answer; `count <n>` calls the `count_up` tool, which reports its progress `n` times,
then answers "counted <n>"; `fail` makes the model fail for good (the turn FAILS); anything
else is answered at once with "wrote: <text>".
"""

from __future__ import annotations

import time

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
    tool,
)
from tests.integration.api import api_agents

AGENTS = f"{__name__}:build_loader"
"""What `agent-runner serve --agents` takes to serve these agents."""

WORD_PAUSE_S = 0.05


def story(words: int) -> str:
    """The text `writer` answers to `story <words>`."""
    return " ".join(f"w{i}" for i in range(1, words + 1))


@tool
def count_up(times: int) -> str:
    """Count, reporting each step."""
    for step in range(1, times + 1):
        AgentToolContext.current().report_progress({"step": step})
        time.sleep(WORD_PAUSE_S)
    return f"counted {times}"


def _write(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=last.content)
    assert isinstance(last, UserMessage), last
    if last.content == "fail":
        raise ValueError("the model cannot write that")
    if last.content.startswith("count "):
        times = int(last.content.split()[1])
        return AiMessage(tool_calls=[ToolCall(id="count-1", name="count_up", arguments={"times": times})])
    if not last.content.startswith("story "):
        return AiMessage(content=f"wrote: {last.content}")
    text = story(int(last.content.split()[1]))
    if request.on_delta is not None:
        words = text.split(" ")
        for index, word in enumerate(words):
            request.on_delta(word if index == 0 else f" {word}")
            time.sleep(WORD_PAUSE_S)
    return AiMessage(content=text)


def build_loader() -> InMemoryAgentLoader:
    """Entry point of `--agents`."""
    writer = Agent(id="writer", description="Writes stories.", chat_model=ScriptedChatModel(_write), tools=[count_up])
    return InMemoryAgentLoader([*api_agents.build_agents(), writer])
