"""Graceful endings (`Agent(final_answer=FinalAnswer(...))`) through every store.

A turn that stops for its budget, its model iterations or its steps asks the model once
more, without tools, and ends with that answer as its output, keeping the status of the
limit; without the option it ends with the close-out line only. The histories stay
protocol-valid either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest

import store
from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurn,
    AiMessage,
    Budget,
    ChatRequest,
    ChatResponse,
    DefinitionError,
    FinalAnswer,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
    tool,
)
from agent_runner.event_payloads import payload_of
from agent_runner.events import AgentEvent, AgentEventType
from agent_runner.messages import ModelMessage
from agent_runner.persistence import AgentTurnStore
from agent_runner.snapshot import AgentTurnStatus

S = AgentTurnStatus


class Ended(NamedTuple):
    turn: AgentTurn
    events: list[AgentEvent]


CALL_USAGE = Usage(20, 10)
"""What each model call of these tests costs: 30 tokens."""
SUMMARY = "I looked twice; the report is still missing its last section."


@tool
def look() -> str:
    """Look once more."""
    return "looked"


def _model(requests: list[ChatRequest], *, failing_answer: bool = False) -> ScriptedChatModel:
    """Calls `look` while it has tools; asked without tools, it sums up (or raises)."""

    def answer(request: ChatRequest) -> ChatResponse:
        requests.append(request)
        if not request.tools:
            if failing_answer:
                raise ValueError("the provider is down")
            return ChatResponse(AiMessage(SUMMARY), Usage(15, 5))
        return ChatResponse(AiMessage("", [ToolCall(f"c{len(requests)}", "look", {})]), CALL_USAGE)

    return ScriptedChatModel(answer)


def _run(agent: Agent, database_url: str | None, turn_store: AgentTurnStore, max_steps: int = 200) -> Ended:
    """Run a turn of `agent` to its end on a runner of its own (its own store objects on SQL)."""
    events: list[AgentEvent] = []
    policy = AgentExecutionPolicy(max_steps=max_steps)
    with contextlib.ExitStack() as stack:
        turns = turn_store if database_url is None else stack.enter_context(store.SqlAgentTurnStore(database_url))
        runner = AgentRunner(turns, InMemoryAgentLoader([agent]), policy=policy)
        runner.add_event_listener(events.append)
        ended = runner.run(agent, "write the report")
    for event in events:
        payload_of(event)  # every event has its type's shape
    return Ended(turn_store.load(ended.id), events)


def _assert_protocol_valid(messages: Sequence[ModelMessage]) -> None:
    for index, message in enumerate(messages):
        if isinstance(message, AiMessage) and message.tool_calls:
            answers = messages[index + 1 : index + 1 + len(message.tool_calls)]
            assert [m.tool_call_id for m in answers if isinstance(m, ToolMessage)] == [c.id for c in message.tool_calls]


LIMITS: dict[str, tuple[AgentTurnStatus, dict[str, Any], int]] = {
    "iterations": (S.MAX_ITERATIONS_REACHED, {"max_iterations": 2}, 200),
    "steps": (S.MAX_STEPS_REACHED, {}, 3),
    "budget": (S.BUDGET_EXCEEDED, {"budget": Budget(max_total_tokens=100)}, 200),
}
"""Each limit: the status it ends with, the agent's fields that set it, and the policy's `max_steps`."""


@pytest.mark.parametrize("answered", [True, False], ids=["final-answer", "close-out"])
@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_a_turn_stopped_by_a_limit_keeps_the_limit_status_and_ends_with_a_final_answer_when_asked(
    limit: str, answered: bool, database_url: str | None, turn_store: AgentTurnStore
) -> None:
    status, fields, max_steps = LIMITS[limit]
    requests: list[ChatRequest] = []
    final = FinalAnswer(reserved_tokens=40) if answered else None
    agent = Agent("reporter", chat_model=_model(requests), tools=[look], final_answer=final, **fields)

    ended, events = _run(agent, database_url, turn_store, max_steps)

    assert ended.status is status
    _assert_protocol_valid(ended.messages)
    if not answered:
        assert ended.final_output is None and all(r.tools for r in requests)
        assert ended.messages[-1].content == f"This turn ended before it was finished: {ended.error}"
        return
    assert ended.final_output == SUMMARY
    assert isinstance(ended.messages[-1], AiMessage) and ended.messages[-1].content == SUMMARY
    # The last request offered no tools, held a valid history, and ended with the instruction
    last = requests[-1]
    assert last.tools == [] and len([r for r in requests if not r.tools]) == 1
    _assert_protocol_valid(last.messages)
    assert isinstance(last.messages[-1], UserMessage) and "Do not call tools" in last.messages[-1].content
    assert ended.error is not None and ended.error in last.messages[-1].content
    # The answer is counted as a model call, and the instruction is not kept in the history
    assert ended.usage.total_tokens == CALL_USAGE.total_tokens * (len(requests) - 1) + 20
    assert not any(isinstance(m, UserMessage) and "Do not call tools" in m.content for m in ended.messages)
    ended_events = [e for e in events if e.type.is_terminal]
    assert [e.data["final_output"] for e in ended_events] == [SUMMARY]
    assert [e.type for e in events][-2:] == [AgentEventType.MODEL_RESPONSE, ended_events[0].type]


def test_the_budget_reserve_stops_the_work_early_so_the_answer_fits(
    database_url: str | None, turn_store: AgentTurnStore
) -> None:
    requests: list[ChatRequest] = []
    # 100 tokens, 40 kept for the answer: the work stops past 60 (two calls of 30 fit, the third does not)
    agent = Agent(
        "reporter",
        chat_model=_model(requests),
        tools=[look],
        budget=Budget(max_total_tokens=100),
        final_answer=FinalAnswer(reserved_tokens=40),
    )
    ended = _run(agent, database_url, turn_store).turn
    assert ended.status is S.BUDGET_EXCEEDED and ended.final_output == SUMMARY
    assert len([r for r in requests if r.tools]) == 3
    assert "budget of 60 (less the final answer's reserve)" in (ended.error or "")


def test_a_final_answer_that_fails_leaves_the_close_out(database_url: str | None, turn_store: AgentTurnStore) -> None:
    requests: list[ChatRequest] = []
    model = _model(requests, failing_answer=True)
    agent = Agent("reporter", chat_model=model, tools=[look], max_iterations=1, final_answer=FinalAnswer())
    ended = _run(agent, database_url, turn_store).turn
    assert ended.status is S.MAX_ITERATIONS_REACHED and ended.final_output is None
    assert ended.messages[-1].content == f"This turn ended before it was finished: {ended.error}"


def test_a_reserve_larger_than_the_budget_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="reserves more than the budget"):
        Agent("a", budget=Budget(max_total_tokens=10), final_answer=FinalAnswer(reserved_tokens=11))
    with pytest.raises(DefinitionError, match="unknown placeholders"):
        FinalAnswer(instruction="stop: {why}")
