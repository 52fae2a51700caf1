"""The turn view shows why a turn waits for a retry."""

from __future__ import annotations

from agent_runner import Agent, AgentRunner, AgentTurnStatus, AiMessage, RecoverableError, ScriptedChatModel
from workers.views import turn_view


def test_a_turn_waiting_for_a_retry_shows_the_error_of_the_failed_attempt() -> None:
    agent = Agent(
        id="a", chat_model=ScriptedChatModel([RecoverableError("upstream timed out"), AiMessage(content="ok")])
    )
    turn = AgentRunner().run(agent, "hi")
    assert turn.status is AgentTurnStatus.RETRY_SCHEDULED and turn.error is None
    assert turn_view(turn, agent)["error"] == "RecoverableError: upstream timed out"


def test_a_completed_turn_shows_no_error() -> None:
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="ok")]))
    assert turn_view(AgentRunner().run(agent, "hi"), agent)["error"] is None
