"""A store's cached snapshots spare a resume and the worker's pick-up their loads; a store without them is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pytest

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from agent_runner._runtime import pickup
from agent_runner.events import AgentEvent
from agent_runner.persistence import CachedSnapshots, TurnRef
from agent_runner.snapshot import AgentTurn
from agent_runner.worker import AgentWorker


class PlainStore:
    """An `AgentTurnStore` of the protocol's methods only (as a third-party store may be), counting its loads."""

    def __init__(self) -> None:
        self.inner = InMemoryAgentTurnStore()
        self.loads = 0

    def load(self, turn_id: str) -> AgentTurn:
        self.loads += 1
        return self.inner.load(turn_id)

    def get_ref(self, turn_id: str) -> TurnRef:
        return self.inner.get_ref(turn_id)

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        return self.inner.save(turn, expected_version, events)

    def find_active_turn(self, conversation_id: str, tenant_id: str | None = None) -> AgentTurn | None:
        return self.inner.find_active_turn(conversation_id, tenant_id)

    def request_cancel(self, turn_id: str, reason: str | None = None) -> AgentTurn:
        return self.inner.request_cancel(turn_id, reason)

    def list_turns(
        self,
        *,
        statuses: Sequence[AgentTurnStatus] | None = None,
        conversation_id: str | None = None,
        parent_turn_id: str | None = None,
        limit: int = 100,
        tenant_id: str | None = None,
    ) -> list[AgentTurn]:
        return self.inner.list_turns(
            statuses=statuses,
            conversation_id=conversation_id,
            parent_turn_id=parent_turn_id,
            limit=limit,
            tenant_id=tenant_id,
        )

    def list_runnable(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        return self.inner.list_runnable(now, limit)

    def list_idle(
        self, statuses: Sequence[AgentTurnStatus], updated_before: datetime, limit: int = 100
    ) -> list[TurnRef]:
        return self.inner.list_idle(statuses, updated_before, limit)

    def list_due_retries(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        return self.inner.list_due_retries(now, limit)


class CachingStore(PlainStore):
    """The same store with the optional `CachedSnapshots`."""

    def cached_snapshot(self, turn_id: str) -> AgentTurn | None:
        return self.inner.cached_snapshot(turn_id)


@tool(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"order {order_id}: refunded"


def refund_agent() -> Agent:
    return Agent(
        id="refunds",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="refund-1", name="refund", arguments={"order_id": "1"})]),
                AiMessage(content="refunded"),
            ]
        ),
        tools=[refund],
    )


def approval(turn: AgentTurn) -> AgentResumeCommand:
    assert turn.suspension is not None and turn.suspension.correlation_id is not None
    return AgentResumeCommand.approve_tool(turn.suspension.correlation_id)


@pytest.fixture(autouse=True)
def seen_just_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dispatched turn counts as seen moments ago, however slow the machine."""
    monkeypatch.setattr(pickup, "FRESH_S", 60.0)


@pytest.mark.parametrize(("store_type", "loads"), [(PlainStore, 2), (CachingStore, 0)])
def test_a_resume_to_completion_loads_the_turn_only_from_a_store_without_cached_snapshots(
    store_type: type[PlainStore], loads: int
) -> None:
    store = store_type()
    assert isinstance(store, CachedSnapshots) is (store_type is CachingStore)
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner)
    # Given a turn waiting for the approval of its call
    turn = runner.run(refund_agent(), "refund order 1")
    assert turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL
    store.loads = 0
    # When the call is approved and the worker continues the turn
    runner.submit_resume(turn.id, approval(turn))
    assert worker.run_once() == 2
    # Then the turn completed either way; only the store without cached snapshots was read for it
    assert store.loads == loads
    assert store.inner.load(turn.id).status is AgentTurnStatus.COMPLETED


def test_a_pickup_after_another_holder_took_the_lease_loads_the_turn() -> None:
    store = CachingStore()
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner)
    turn = runner.run(refund_agent(), "refund order 1")
    runner.submit_resume(turn.id, approval(turn))
    # Given another holder that took the turn's lease and gave it up without a save
    taken = worker.lease.acquire(turn.id, "someone-else", 1_000)
    assert taken is not None and worker.lease.release(taken)
    store.loads = 0
    # When the worker picks the dispatched turn up, its fence does not follow the snapshot's
    assert worker.run_once() == 2
    # Then it loaded the turn rather than trust the cached snapshot
    assert store.loads == 1
    assert store.inner.load(turn.id).status is AgentTurnStatus.COMPLETED
