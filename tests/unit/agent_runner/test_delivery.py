"""`AgentRunner.deliver`: the one delivery of the embedded worker and the Celery task, with what differs passed in a `TurnHolder`.

Every `DeliveryOutcome` a delivery can report has a scenario here; the follow-up runs once the
lease is released, and the holder's values (budget, `may_step`, the pick-up hook) are the ones used.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial

import pytest

from agent_runner import Agent, AgentRunner, AgentTurnStatus, AiMessage, ScriptedChatModel, ToolCall, tool
from agent_runner.in_memory import InMemoryTurnLease
from agent_runner.leasing import HeldLease, LeaseKeeper, TurnHolder
from agent_runner.results import Delivery, DeliveryOutcome, StopReason
from agent_runner.snapshot import AgentTurn

S = AgentTurnStatus


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def _agent() -> Agent:
    """Two tool calls, then an answer: five steps."""
    calls = [AiMessage(tool_calls=[ToolCall(id=f"c{i}", name="lookup", arguments={"key": str(i)})]) for i in (1, 2)]
    return Agent(id="looker", chat_model=ScriptedChatModel([*calls, AiMessage(content="done")]), tools=[lookup])


class Holding:
    """A holder over one lease backend that records what it saw, and whether the lease was held at the follow-up."""

    def __init__(self, lease: InMemoryTurnLease | None = None) -> None:
        self.lease = lease or InMemoryTurnLease()
        self.keeper = LeaseKeeper(self.lease, 30_000, name="test")
        self.picked: list[AgentTurn] = []
        self.followed: list[tuple[Delivery, int]] = []

    def then(self, delivery: Delivery) -> None:
        self.followed.append((delivery, self.keeper.held))

    def holder(
        self, *, max_steps: int | None = None, may_step: Callable[[HeldLease], bool] | None = None
    ) -> TurnHolder:
        return TurnHolder(
            partial(self.keeper.holding, owner="holder"),
            may_step or self.keeper.may_step,
            max_steps=max_steps,
            picked_up=self.picked.append,
            then=self.then,
        )


def stepped() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look")
    delivery = runner.deliver(turn.id, holding.holder(), version=turn.version)
    assert delivery.result is not None and delivery.result.stopped is StopReason.ENDED
    assert delivery.turn is not None and delivery.turn.status is S.COMPLETED and delivery.result.steps == 5
    assert [picked.version for picked in holding.picked] == [turn.version]
    return runner, holding, delivery


def lease_held() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look")
    assert holding.lease.acquire(turn.id, "someone else", 30_000) is not None
    delivery = runner.deliver(turn.id, holding.holder())
    assert runner.turn_store.load(turn.id).status is S.READY and holding.picked == []
    return runner, holding, delivery


def stale() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look")
    delivery = runner.deliver(turn.id, holding.holder(), version=turn.version + 1)
    assert runner.turn_store.load(turn.id).version == turn.version and holding.picked == []
    return runner, holding, delivery


def not_found() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    return runner, holding, runner.deliver("no-such-turn", holding.holder())


def not_runnable() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look")
    runner.deliver(turn.id, holding.holder())
    delivery = runner.deliver(turn.id, holding.holder())
    assert delivery.turn is not None and delivery.turn.status is S.COMPLETED
    return runner, holding, delivery


def not_due() -> tuple[AgentRunner, Holding, Delivery]:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look", not_before=runner.clock() + timedelta(hours=1))
    delivery = runner.deliver(turn.id, holding.holder(), version=turn.version)
    assert runner.turn_store.load(turn.id).steps == 0
    return runner, holding, delivery


SCENARIOS: dict[DeliveryOutcome, Callable[[], tuple[AgentRunner, Holding, Delivery]]] = {
    DeliveryOutcome.STEPPED: stepped,
    DeliveryOutcome.LEASE_HELD: lease_held,
    DeliveryOutcome.STALE: stale,
    DeliveryOutcome.NOT_FOUND: not_found,
    DeliveryOutcome.NOT_RUNNABLE: not_runnable,
    DeliveryOutcome.NOT_DUE: not_due,
}


def test_every_outcome_a_delivery_reports_has_a_scenario() -> None:
    # REJECTED is the Celery task's: a message whose arguments do not fit is dropped before any delivery
    assert set(SCENARIOS) == set(DeliveryOutcome) - {DeliveryOutcome.REJECTED}


@pytest.mark.parametrize("outcome", list(SCENARIOS), ids=lambda outcome: outcome.value)
def test_each_outcome_is_reported_to_the_follow_up_once_the_lease_is_released(outcome: DeliveryOutcome) -> None:
    _, holding, delivery = SCENARIOS[outcome]()
    assert delivery.outcome is outcome
    # The follow-up saw this delivery last, and no lease of the holder was held any more
    assert holding.followed[-1] == (delivery, 0)


def test_a_delivery_steps_within_the_holders_budget_and_stops_when_its_lease_may_not_step() -> None:
    runner, holding = AgentRunner(), Holding()
    turn = runner.start(_agent(), "look")
    # Given a budget of two steps: two steps, and the turn is left runnable for the next delivery
    first = runner.deliver(turn.id, holding.holder(max_steps=2))
    assert first.result is not None and (first.result.stopped, first.result.steps) == (StopReason.BUDGET, 2)
    # Given a holder whose lease may not step (lost, a stopping worker): no step, and nothing saved
    refused = runner.deliver(turn.id, holding.holder(may_step=lambda held: False))
    assert refused.result is not None and (refused.result.stopped, refused.result.steps) == (StopReason.STOPPED, 0)
    assert runner.turn_store.load(turn.id).version == first.result.turn.version
    # The next delivery goes on from where the first stopped
    last = runner.deliver(turn.id, holding.holder())
    assert last.turn is not None and last.turn.status is S.COMPLETED and last.result is not None
    assert last.result.steps == 3


def test_a_waiting_turn_flagged_for_cancel_is_ended_by_its_delivery() -> None:
    # Given a turn that waits for approval, and a cancel flag saved on it (a cancel that came mid-step)
    runner, holding = AgentRunner(), Holding()

    @tool(requires_approval=True)
    def delete(user: str) -> str:
        """Delete a user."""
        return user

    agent = Agent(
        id="admin",
        chat_model=ScriptedChatModel(
            [AiMessage(tool_calls=[ToolCall(id="d", name="delete", arguments={"user": "u"})])]
        ),
        tools=[delete],
    )
    turn = runner.start(agent, "delete u")
    waiting = runner.deliver(turn.id, holding.holder()).turn
    assert waiting is not None and waiting.status is S.WAITING_FOR_APPROVAL
    flagged = runner.turn_store.save(waiting.model_copy(update={"cancel_requested": True}), waiting.version)
    # When it is delivered, it is stepped although it is not runnable: the cancel ends it
    delivery = runner.deliver(turn.id, holding.holder())
    assert delivery.outcome is DeliveryOutcome.STEPPED and delivery.turn is not None
    assert delivery.turn.status is S.CANCELLED and delivery.turn.version > flagged.version
