"""Every `StopReason` is what `AgentRunner.advance` reports in some real situation, and only then.

Each scenario drives a fresh in-memory runner into one reason; a reason added without a
scenario here fails `test_every_stop_reason_has_a_scenario`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_runner import (
    AdvanceResult,
    Agent,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ChatResponse,
    LeaseLostError,
    ScriptedChatModel,
    StopReason,
    ToolCall,
    tool,
)

S = AgentTurnStatus


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(requires_approval=True)
def delete_account(user: str) -> str:
    """Delete a user's account."""
    return f"deleted {user}"


def _calls_then_answers(tool_name: str, arguments: dict[str, str]) -> ScriptedChatModel:
    return ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name=tool_name, arguments=arguments)]), AiMessage(content="done")]
    )


def blocked() -> AdvanceResult:
    """The model asks for a tool that needs approval: the turn waits for a person."""
    runner = AgentRunner()
    agent = Agent(id="admin", chat_model=_calls_then_answers("delete_account", {"user": "u1"}), tools=[delete_account])
    result = runner.advance(runner.start(agent, "delete u1"))
    assert result.turn.status is S.WAITING_FOR_APPROVAL and result.error is None
    return result


def ended() -> AdvanceResult:
    """The model answers: the turn completes."""
    runner = AgentRunner()
    result = runner.advance(runner.start(Agent(id="talker", chat_model=ScriptedChatModel([AiMessage("hi")])), "hi"))
    assert result.turn.status is S.COMPLETED and result.steps == 1
    return result


def budget() -> AdvanceResult:
    """One step allowed of a turn that needs three: it stops, still runnable."""
    runner = AgentRunner()
    agent = Agent(id="reader", chat_model=_calls_then_answers("lookup", {"key": "k"}), tools=[lookup])
    result = runner.advance(runner.start(agent, "look k up"), max_steps=1)
    assert result.steps == 1 and result.turn.status is S.RUNNING
    return result


def stopped() -> AdvanceResult:
    """The caller may not continue (its lease is at risk): no step is made."""
    runner = AgentRunner()
    turn = runner.start(Agent(id="talker", chat_model=ScriptedChatModel([AiMessage("hi")])), "hi")
    result = runner.advance(turn, may_continue=lambda: False)
    assert result.steps == 0 and result.turn.status is S.READY
    return result


def lease_lost() -> AdvanceResult:
    """A newer lease holder has saved the turn: a save under the older fence is refused."""
    runner = AgentRunner()
    turn = runner.start(Agent(id="talker", chat_model=ScriptedChatModel([AiMessage("hi")])), "hi")
    runner.turn_store.save(turn.model_copy(update={"lease_fence": 2}), turn.version)
    result = runner.advance(runner.turn_store.load(turn.id), fence=1)
    assert isinstance(result.error, LeaseLostError) and result.steps == 0
    assert runner.turn_store.load(turn.id).status is S.READY  # nothing of the old holder was saved
    return result


def conflict() -> AdvanceResult:
    """Someone else saves the turn while the model answers: their snapshot wins."""
    runner = AgentRunner()

    def answer_while_another_saves(request: ChatRequest) -> ChatResponse:
        current = runner.turn_store.load(turn.id)
        runner.turn_store.save(current.model_copy(update={"metadata": {"by": "another worker"}}), current.version)
        return ChatResponse(message=AiMessage(content="hi"))

    turn = runner.start(Agent(id="talker", chat_model=ScriptedChatModel(answer_while_another_saves)), "hi")
    result = runner.advance(turn)
    assert result.turn.metadata == {"by": "another worker"} and result.turn.status is S.RUNNING
    assert result.steps == 0 and result.error is None
    return result


def failed() -> AdvanceResult:
    """A step raises (the agent has no model): the failure is counted, the turn stays runnable."""
    runner = AgentRunner()
    result = runner.advance(runner.start(Agent(id="modelless"), "hi"))
    assert result.error is not None and "no chat_model" in str(result.error)
    assert result.turn.step_failures == 1 and not result.turn.is_terminal
    return result


SCENARIOS: dict[StopReason, Callable[[], AdvanceResult]] = {
    StopReason.BLOCKED: blocked,
    StopReason.ENDED: ended,
    StopReason.BUDGET: budget,
    StopReason.STOPPED: stopped,
    StopReason.LEASE_LOST: lease_lost,
    StopReason.CONFLICT: conflict,
    StopReason.FAILED: failed,
}


def test_every_stop_reason_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(StopReason)


@pytest.mark.parametrize("reason", list(SCENARIOS), ids=str)
def test_a_scenario_stops_for_its_reason(reason: StopReason) -> None:
    assert SCENARIOS[reason]().stopped is reason
