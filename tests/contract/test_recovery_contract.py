"""The recovery budget through every store: takeovers from holders that died without saving are counted and bounded.

A holder "dies" here by an exception no step catches (`HolderDied`, a `BaseException`),
raised by a tool: nothing after it is saved, as when the process is killed in the tool.
Each holder takes the next fence, as lease acquisitions do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

import store
from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AiMessage,
    InMemoryAgentLoader,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from agent_runner.event_payloads import payload_of
from agent_runner.events import AgentEvent, AgentEventType
from agent_runner.persistence import AgentTurnStore
from agent_runner.snapshot import AgentTurnStatus
from agent_runner.tools import Tool


class HolderDied(BaseException):
    """The process stepping the turn stops dead: no step's handler sees it."""


def _dying(dies: Callable[[int], bool]) -> tuple[Tool, list[int]]:
    """A tool `work` that kills its holder on the runs `dies` says yes to (1, 2, ...), and the list of its runs."""
    runs: list[int] = []

    @tool
    def work() -> str:
        """Work (it may take the worker down)."""
        runs.append(len(runs) + 1)
        if dies(len(runs)):
            raise HolderDied
        return "done"

    return work, runs


@pytest.fixture
def make_runner(database_url: str | None, turn_store: AgentTurnStore) -> Iterator[list[AgentEvent]]:
    """The events of the runners `_holders` builds; each must have its type's shape."""
    events: list[AgentEvent] = []
    yield events
    for event in events:
        payload_of(event)


def _holders(
    agent: Agent, database_url: str | None, turn_store: AgentTurnStore, events: list[AgentEvent], holders: int
) -> str:
    """Start a turn, then let `holders` holders in turn (fences 1, 2, ...) pick it up, each on a store of its own."""
    policy = AgentExecutionPolicy(max_recoveries=3)
    turn_id = ""
    with contextlib.ExitStack() as stack:
        for fence in range(1, holders + 1):
            turns = turn_store if database_url is None else stack.enter_context(store.SqlAgentTurnStore(database_url))
            runner = AgentRunner(turns, InMemoryAgentLoader([agent]), policy=policy)
            runner.add_event_listener(events.append)
            if not turn_id:
                turn_id = runner.start(agent, "check the servers").id
            current = runner.turn_store.load(turn_id)
            if current.is_terminal:
                break
            with contextlib.suppress(HolderDied):
                runner.advance(current, fence=fence)
    return turn_id


def test_a_tool_that_kills_every_holder_ends_the_turn_after_the_budget_with_its_output_so_far(
    database_url: str | None, turn_store: AgentTurnStore, make_runner: list[AgentEvent]
) -> None:
    reboot, runs = _dying(lambda run: True)
    model = ScriptedChatModel([AiMessage("Checked: two servers are slow.", [ToolCall("c1", "work", {})])])
    agent = Agent("ops", chat_model=model, tools=[reboot])

    turn_id = _holders(agent, database_url, turn_store, make_runner, holders=10)

    ended = turn_store.load(turn_id)
    assert ended.status is AgentTurnStatus.FAILED
    assert ended.final_output == "Checked: two servers are slow."
    assert ended.error is not None and "recovery budget 3" in ended.error
    # Holder 1 saved the model's answer, so holder 2 is not seen as a takeover; holders 3 to 5
    # are the three allowed, and holder 6 ends the turn without running the tool
    assert len(runs) == 5 and ended.recoveries == 4
    recovering = [e.data["recoveries"] for e in make_runner if e.type is AgentEventType.TURN_RECOVERING]
    assert recovering == [1, 2, 3]
    # The close-out keeps the history protocol-valid
    assert [m.role for m in ended.messages[-3:]] == ["assistant", "tool", "assistant"]


def test_progress_restarts_the_count_and_ordinary_handoffs_are_no_takeovers(
    database_url: str | None, turn_store: AgentTurnStore, make_runner: list[AgentEvent]
) -> None:
    # Each call dies twice in a row before it works
    flaky, _ = _dying(lambda run: run % 3 != 0)
    script = [AiMessage("", [ToolCall(f"c{i}", "work", {})]) for i in range(3)] + [AiMessage("all done")]
    agent = Agent("ops", chat_model=ScriptedChatModel(script), tools=[flaky])

    turn_id = _holders(agent, database_url, turn_store, make_runner, holders=30)

    ended = turn_store.load(turn_id)
    assert ended.status is AgentTurnStatus.COMPLETED and ended.final_output == "all done"
    recovering = [e.data["recoveries"] for e in make_runner if e.type is AgentEventType.TURN_RECOVERING]
    # Each call's second death is seen (the first follows a save), and progress restarts the count
    assert recovering == [1, 1, 1]


def test_holders_that_stop_after_each_step_are_not_takeovers(
    database_url: str | None, turn_store: AgentTurnStore, make_runner: list[AgentEvent]
) -> None:
    script = [AiMessage("", [ToolCall(f"c{i}", "noop", {})]) for i in range(3)] + [AiMessage("fine")]

    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    agent = Agent("ops", chat_model=ScriptedChatModel(script), tools=[noop])
    policy = AgentExecutionPolicy(max_recoveries=1)
    runner = AgentRunner(turn_store, InMemoryAgentLoader([agent]), policy=policy)
    runner.add_event_listener(make_runner.append)
    turn = runner.start(agent, "go")
    for fence in range(1, 20):
        turn = runner.advance(runner.turn_store.load(turn.id), fence=fence, max_steps=1).turn
        if turn.is_terminal:
            break
    assert turn.status is AgentTurnStatus.COMPLETED
    assert not [e for e in make_runner if e.type is AgentEventType.TURN_RECOVERING]
