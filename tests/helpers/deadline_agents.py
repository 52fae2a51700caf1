"""An agent whose approvals wait a few seconds, for the tests of deadlines in each embedded path.

The test process imports it, and so do the `agent-runner worker` and `agent-runner serve`
processes the tests start (`--agents tests.helpers.deadline_agents:build_loader`). The
scripted model plays from the turn's last message:

- `restart <service>`: calls `restart` (needs approval; approved by default once
  `APPROVAL_TIMEOUT_S` passed), then answers "done: <result>";
- `deploy <service>`: calls `deploy` (needs approval; rejected by default), then answers
  "not done: <what the tool message says>".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)

APPROVAL_TIMEOUT_S = 3.0
"""How long an approval waits; the reminder comes at half of it (see `SWEEP_ENV`)."""

SWEEP_ENV = {"AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S": "0.2", "AGENT_RUNNER_DEADLINE_REMINDER": "0.5"}
"""Settings of the processes under test: a sweep five times a second, the reminder halfway."""


@tool(requires_approval=True, approval_timeout=APPROVAL_TIMEOUT_S, on_timeout="approve")
def restart(service: str) -> str:
    """Restart a service."""
    return f"restarted {service}"


@tool(requires_approval=True, approval_timeout=APPROVAL_TIMEOUT_S, on_timeout="reject")
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def _answer(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return AiMessage(content=f"not done: {last.content}" if last.is_error else f"done: {last.content}")
    assert isinstance(last, UserMessage), last
    name, _, service = last.content.partition(" ")
    return AiMessage(tool_calls=[ToolCall(id=f"call-{name}", name=name, arguments={"service": service})])


def build_loader() -> InMemoryAgentLoader:
    """Entry point of `--agents tests.helpers.deadline_agents:build_loader`: the `ops` agent."""
    return InMemoryAgentLoader([Agent(id="ops", chat_model=ScriptedChatModel(_answer), tools=[restart, deploy])])


def deadline_problems(events: Sequence[AgentEvent], call_id: str) -> list[str]:
    """What is wrong with the durable events of a turn whose approval of `call_id` was left to its deadline.

    Expected: the suspension names its deadline; one DEADLINE_APPROACHING before it; then
    one TURN_RESUMED by the deadline command, decided by `"system"`, at or after it.
    """
    suspended = [e for e in events if e.type is AgentEventType.TURN_SUSPENDED]
    if len(suspended) != 1 or "deadline" not in suspended[0].data:
        return [f"expected one TURN_SUSPENDED with a deadline, got {[e.data for e in suspended]}"]
    deadline = datetime.fromisoformat(suspended[0].data["deadline"])
    problems: list[str] = []
    reminders = [e for e in events if e.type is AgentEventType.DEADLINE_APPROACHING]
    if [e.data.get("correlation_id") for e in reminders] != [call_id]:
        problems.append(f"expected one reminder of {call_id}, got {[e.data for e in reminders]}")
    elif not suspended[0].timestamp < reminders[0].timestamp < deadline:
        problems.append(f"the reminder at {reminders[0].timestamp} is not between the suspension and {deadline}")
    resumes = [e for e in events if e.type is AgentEventType.TURN_RESUMED]
    decided = [
        (e.data.get("command"), e.data.get("tool_call_id"), e.data["metadata"].get("decided_by")) for e in resumes
    ]
    if decided != [("DEADLINE", call_id, "system")]:
        problems.append(f"expected one resume by the deadline, decided by system, got {decided}")
    elif resumes[0].timestamp < deadline:
        problems.append(f"the deadline's default was applied at {resumes[0].timestamp}, before {deadline}")
    return problems
