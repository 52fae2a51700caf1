"""A resume picked up without loads: the statements it costs, and stale cached snapshots (real SQL stores).

`submit_resume` and the worker's pick-up start from the snapshot the store keeps at hand;
another process that changed the turn meanwhile is caught by the compare-and-swap of the
next save, and the turn still completes from the stored snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    InMemoryTurnLease,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from agent_runner._runtime import pickup
from agent_runner.worker import AgentWorker
from store import SqlAgentTurnStore

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def seen_just_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dispatched turn counts as seen moments ago, however slow the machine: these tests are about the cache."""
    monkeypatch.setattr(pickup, "FRESH_S", 60.0)


def refund_agent(refunded: list[str], approvals: int = 1) -> Agent:
    """An agent that asks for `approvals` refunds, each needing approval, one after the other, then answers."""

    @tool(requires_approval=True)
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"order {order_id}: refunded"

    def respond(request: ChatRequest) -> AiMessage:
        done = sum(1 for message in request.messages if isinstance(message, ToolMessage))
        if done < approvals:
            return AiMessage(
                tool_calls=[ToolCall(id=f"refund-{done}", name="refund", arguments={"order_id": str(done)})]
            )
        return AiMessage(content=f"{done} refund(s) done")

    return Agent(id="refunds", chat_model=ScriptedChatModel(respond), tools=[refund])


def approval(turn: AgentTurn) -> AgentResumeCommand:
    assert turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL and turn.suspension is not None
    call_id = turn.suspension.correlation_id
    assert call_id is not None
    return AgentResumeCommand.approve_tool(call_id)


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


@pytest.fixture
def two_stores(sql_url: str) -> Iterator[tuple[SqlAgentTurnStore, SqlAgentTurnStore]]:
    """Two stores on one database: this process's, and another process's."""
    with SqlAgentTurnStore(sql_url) as here, SqlAgentTurnStore(sql_url) as elsewhere:
        yield here, elsewhere


def test_an_in_process_resume_to_completion_is_three_statements_on_postgresql(
    pg_url: str, driver_statements: list[str]
) -> None:
    # Given a worker with the in-process lease serving a runner on PostgreSQL
    refunded: list[str] = []
    agent = refund_agent(refunded)
    completed: dict[str, threading.Event] = {}

    def on_event(event: AgentEvent) -> None:
        if event.type is AgentEventType.TURN_COMPLETED:
            completed[event.turn_id].set()

    with SqlAgentTurnStore(pg_url) as turns:
        runner = AgentRunner(turn_store=turns)
        runner.add_event_listener(on_event)
        # Polls and deadline sweeps are out of the way: only the resume's work is counted
        worker = AgentWorker(runner, lease=InMemoryTurnLease(), poll_interval=3600, deadline_interval=None)
        waiting = [runner.run(agent, f"refund order {n}") for n in range(2)]
        for turn in waiting:
            completed[turn.id] = threading.Event()
        with worker:
            # A first resume warms up the worker and the connections (its first poll is over after it)
            runner.submit_resume(waiting[0].id, approval(waiting[0]))
            assert completed[waiting[0].id].wait(10)
            time.sleep(0.1)
            # When a person approves the other turn's call
            driver_statements.clear()
            runner.submit_resume(waiting[1].id, approval(waiting[1]))
            assert completed[waiting[1].id].wait(10)
            time.sleep(0.1)  # anything the worker sends after the completion counts too
        # Then the turn completed in three saves: the resume's, the tool step's and the model step's;
        # beside them, three reads of its steering messages (before the model call, after an answer
        # that would end the turn, and when it ended, for messages to hand on)
        steering = [text for text in driver_statements if "FROM agent_turn_steering" in text]
        saves = [text for text in driver_statements if text not in steering]
        assert len(saves) == 3, driver_statements
        assert len(steering) == 3, driver_statements
        assert turns.load(waiting[1].id).status is AgentTurnStatus.COMPLETED
        assert refunded == ["0", "0"]


def approved_here(store: SqlAgentTurnStore, agent: Agent) -> tuple[AgentWorker, AgentTurn, AgentTurn]:
    """A worker of a runner on `store`, and a turn of `agent` that waited for approval and was approved there.

    Returns the worker (the turn is dispatched to it, not yet picked up), the waiting
    snapshot and the resumed one, which `store` keeps at hand.
    """
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner, lease=InMemoryTurnLease(), deadline_interval=None)
    turn = runner.run(agent, "refund order 0")
    resumed = runner.submit_resume(turn.id, approval(turn))
    assert store.cached_snapshot(turn.id) == resumed
    return worker, turn, resumed


def test_a_turn_changed_elsewhere_between_resume_and_pickup_refuses_the_stale_save_and_completes(
    two_stores: tuple[SqlAgentTurnStore, SqlAgentTurnStore], caplog: pytest.LogCaptureFixture
) -> None:
    here, elsewhere = two_stores
    refunded: list[str] = []
    # Given a turn waiting for approval, resumed here: this store holds the RUNNING snapshot
    worker, turn, resumed = approved_here(here, refund_agent(refunded))
    # And another process that saves a change of the turn before the worker picks it up
    stored = elsewhere.load(turn.id)
    changed = elsewhere.save(stored.model_copy(update={"metadata": {"note": "changed elsewhere"}}), stored.version)
    # When the worker picks the dispatched turn up
    with caplog.at_level(logging.WARNING, logger="agent_runner"):
        worker.run_once()
    # Then the step based on the cached snapshot lost its compare-and-swap
    assert any("changed while a step ran" in record.getMessage() for record in caplog.records)
    # And the worker went on from the stored snapshot: the change is kept, the turn completed
    final = elsewhere.load(turn.id)
    assert final.status is AgentTurnStatus.COMPLETED
    assert final.version > changed.version
    assert final.metadata == {"note": "changed elsewhere"}
    assert [m.tool_call_id for m in final.messages if isinstance(m, ToolMessage)] == ["refund-0"]
    assert isinstance(final.messages[-1], AiMessage) and final.messages[-1].content == "1 refund(s) done"


def test_a_resume_that_does_not_fit_the_cached_snapshot_is_decided_on_the_stored_one(
    two_stores: tuple[SqlAgentTurnStore, SqlAgentTurnStore],
) -> None:
    here, elsewhere = two_stores
    refunded: list[str] = []
    agent = refund_agent(refunded, approvals=2)
    runner_here = AgentRunner(turn_store=here)
    runner_elsewhere = AgentRunner(turn_store=elsewhere, agent_loader=InMemoryAgentLoader([agent]))
    # Given a turn this store last saw waiting for the first approval
    first = runner_here.run(agent, "refund orders 0 and 1")
    assert here.cached_snapshot(first.id) == first
    # And another process that approved it and ran it to the second approval
    second = runner_elsewhere.resume(first.id, approval(first))
    assert first.suspension is not None and second.suspension is not None
    assert second.suspension.correlation_id != first.suspension.correlation_id
    # When the second call is approved here, where only the first is known
    resumed = runner_here.resume(first.id, approval(second))
    # Then the command was checked against the stored snapshot, and the turn completed
    assert resumed.status is AgentTurnStatus.COMPLETED
    assert refunded == ["0", "1"]


def test_a_cancel_requested_elsewhere_before_a_late_pickup_stops_the_approved_call(
    two_stores: tuple[SqlAgentTurnStore, SqlAgentTurnStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, elsewhere = two_stores
    refunded: list[str] = []
    # Given a turn approved here and dispatched to the worker (RUNNING: a cancel only flags it)
    worker, turn, resumed = approved_here(here, refund_agent(refunded))
    assert resumed.status is AgentTurnStatus.RUNNING
    # And a cancel requested through another process's store, which keeps the version
    flagged = elsewhere.request_cancel(turn.id, reason="the customer withdrew")
    assert flagged.version == resumed.version and here.cached_snapshot(turn.id) == resumed
    # When the worker picks the turn up after the freshness bound of what it was handed
    monkeypatch.setattr(pickup, "FRESH_S", 0.0)
    worker.run_once()
    # Then it loaded the turn, saw the cancel and ended it without making the approved call
    final = elsewhere.load(turn.id)
    assert (final.status, final.error) == (AgentTurnStatus.CANCELLED, "the customer withdrew")
    assert refunded == []
