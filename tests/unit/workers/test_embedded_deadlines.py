"""The HTTP server's embedded mode applies approval deadlines itself (there is no beat)."""

from __future__ import annotations

import time
from pathlib import Path

from agent_runner import (
    ActionStatus,
    Agent,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from store import SqlAgentTurnStore
from workers.api.runtime import build_runtime
from workers.api.server_settings import ApiSettings, WorkerMode

RAN: list[str] = []


@tool(requires_approval=True, approval_timeout=0.5, on_timeout="approve")
def restart(service: str) -> str:
    """Restart a service."""
    RAN.append(service)
    return f"restarted {service}"


def test_an_expired_approval_is_approved_by_the_embedded_server(tmp_path: Path) -> None:
    RAN.clear()
    agent = Agent(
        id="ops",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="r1", name="restart", arguments={"service": "api"})]),
                AiMessage(content="ok"),
            ]
        ),
        tools=[restart],
    )
    url = f"sqlite:///{tmp_path / 'server.db'}"
    settings = ApiSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": url,
            "AGENT_RUNNER_API_WORKER": WorkerMode.EMBEDDED.value,
            "AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S": "0.1",
        }
    )
    runtime = build_runtime(settings, InMemoryAgentLoader([agent]))
    runtime.start()
    try:
        turn = runtime.runner.start("ops", "restart the api")
        deadline = time.monotonic() + 30
        while not runtime.turn_store.load(turn.id).is_terminal:
            assert time.monotonic() < deadline, runtime.turn_store.load(turn.id)
            time.sleep(0.05)
    finally:
        runtime.stop()
    with SqlAgentTurnStore(url) as turn_store:
        ended = turn_store.load(turn.id)
    assert ended.status is AgentTurnStatus.COMPLETED and RAN == ["api"]
    (action,) = ended.page_actions
    assert action.status is ActionStatus.APPROVED
    assert (action.decision["decided_by"], action.decision["reason"]) == ("system", "deadline passed")
