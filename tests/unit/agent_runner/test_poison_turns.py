"""Poison turns: a step that keeps raising ends the turn FAILED after a bounded number of attempts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent_runner import (
    Agent,
    AgentEvent,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AgentWorker,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentTurnStore,
    StopReason,
    StoreUnavailableError,
)

S = AgentTurnStatus


class PoisonStore(InMemoryAgentTurnStore):
    """Refuses to save a model response that says "poison", like a payload a database rejects."""

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        if any(isinstance(m, AiMessage) and m.content == "poison" for m in turn.messages):
            raise ValueError("Circular reference detected (depth limit)")
        return super().save(turn, expected_version, events)


class CountingModel:
    def __init__(self, answer: str = "poison") -> None:
        self.calls = 0
        self.answer = answer

    def generate(self, request: ChatRequest) -> ChatResponse:
        self.calls += 1
        return ChatResponse(message=AiMessage(content=self.answer))


def test_a_turn_whose_steps_keep_raising_ends_failed_after_max_step_failures() -> None:
    model = CountingModel()
    runner = AgentRunner(turn_store=PoisonStore(), policy=AgentExecutionPolicy(max_step_failures=3))
    turn = runner.start(Agent(id="poisoned", chat_model=model), "hi")
    outcomes = [runner.advance(runner.turn_store.load(turn.id)) for _ in range(5)]

    assert [o.stopped for o in outcomes[:3]] == [StopReason.FAILED, StopReason.FAILED, StopReason.ENDED]
    assert all(isinstance(o.error, ValueError) for o in outcomes[:3])
    ended = runner.turn_store.load(turn.id)
    assert ended.status is S.FAILED
    assert ended.error is not None and "3 times in a row" in ended.error and "ValueError" in ended.error
    assert isinstance(ended.messages[-1], AiMessage)  # closed out: the history stays protocol-valid
    assert model.calls == 3  # billed three times, never again
    assert outcomes[4].stopped is StopReason.ENDED and outcomes[4].steps == 0


def test_the_count_survives_a_new_runner_and_resets_after_a_good_step() -> None:
    store = PoisonStore()
    model = CountingModel()
    agent = Agent(id="flaky", chat_model=model)
    first = AgentRunner(turn_store=store, policy=AgentExecutionPolicy(max_step_failures=3))
    turn = first.start(agent, "hi")
    first.advance(store.load(turn.id))
    assert store.load(turn.id).step_failures == 1

    # A process restart: the count is in the snapshot, not in the runner.
    second = AgentRunner(turn_store=store, policy=AgentExecutionPolicy(max_step_failures=3))
    second.agent_loader.register(agent)  # type: ignore[attr-defined]
    second.advance(store.load(turn.id))
    assert store.load(turn.id).step_failures == 2

    model.answer = "fine now"
    result = second.advance(store.load(turn.id))
    assert result.turn.status is S.COMPLETED and result.turn.step_failures == 0


def test_transient_store_errors_are_not_counted() -> None:
    class Unreachable(InMemoryAgentTurnStore):
        down = False

        def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
            if self.down and turn.version >= 0:
                raise StoreUnavailableError("database unreachable")
            return super().save(turn, expected_version, events)

    store = Unreachable()
    runner = AgentRunner(turn_store=store, policy=AgentExecutionPolicy(max_step_failures=1))
    turn = runner.start(Agent(id="a", chat_model=CountingModel("ok")), "hi")
    store.down = True
    for _ in range(3):
        assert runner.advance(store.load(turn.id)).stopped is StopReason.FAILED
    assert store.load(turn.id).step_failures == 0 and store.load(turn.id).status is S.READY
    store.down = False
    assert runner.advance(store.load(turn.id)).turn.status is S.COMPLETED


def test_the_embedded_worker_stops_retrying_a_poison_turn() -> None:
    model = CountingModel()
    runner = AgentRunner(turn_store=PoisonStore(), policy=AgentExecutionPolicy(max_step_failures=2))
    worker = AgentWorker(runner, poll_interval=0.01)
    turn = runner.start(Agent(id="poisoned", chat_model=model), "hi")
    for _ in range(20):
        worker._clear_backoff(turn.id)  # skip the back-off between attempts
        worker.run_once()
    assert runner.turn_store.load(turn.id).status is S.FAILED
    assert model.calls == 2


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AgentExecutionPolicy(max_step_failures=0)
