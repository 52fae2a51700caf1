"""The embedded `AgentWorker` with a backlog: turns under way go first; many threads poll the store once."""

from __future__ import annotations

import time

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from agent_runner.worker import AgentWorker
from tests.unit.agent_runner.turn_kit import CountingPolls

BACKLOG = 20


@tool(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def _approval_then_answer(request: ChatRequest) -> AiMessage:
    if any(isinstance(m, ToolMessage) for m in request.messages):
        return AiMessage(content="refund done")
    return AiMessage(tool_calls=[ToolCall(id="c1", name="refund", arguments={"order_id": "A-1"})])


class Order:
    """Records, in order, which turn gave a model answer and which turn completed."""

    def __init__(self) -> None:
        self.events: list[tuple[AgentEventType, str]] = []

    def __call__(self, event: AgentEvent) -> None:
        if event.type in (AgentEventType.MODEL_RESPONSE, AgentEventType.TURN_COMPLETED):
            self.events.append((event.type, event.turn_id))

    def new_turns_answered_before(self, turn_id: str, backlog: list[str]) -> list[str]:
        done = self.events.index((AgentEventType.TURN_COMPLETED, turn_id))
        return [t for kind, t in self.events[:done] if kind is AgentEventType.MODEL_RESPONSE and t in backlog]


def _resumed_behind_a_backlog(runner: AgentRunner, worker: AgentWorker) -> tuple[str, list[str]]:
    """A turn waiting for approval, then a backlog of new turns, then the approval; nothing stepped yet."""
    support = Agent(id="support", chat_model=ScriptedChatModel(_approval_then_answer), tools=[refund])
    quick = Agent(id="quick", chat_model=ScriptedChatModel(lambda request: AiMessage(content="hi")))
    waiting = runner.start(support, "refund A-1")
    worker.run_once()
    assert runner.turn_store.load(waiting.id).status is AgentTurnStatus.WAITING_FOR_APPROVAL
    backlog = [runner.start(quick, f"question {i}").id for i in range(BACKLOG)]
    runner.submit_resume(waiting.id, AgentResumeCommand.approve_tool("c1"))
    return waiting.id, backlog


def test_a_resumed_turn_dispatched_after_a_backlog_of_new_turns_finishes_first() -> None:
    # Given a worker that is its runner's dispatcher, a backlog of new turns dispatched to
    # it, and then a turn under way resumed
    runner = AgentRunner()
    worker = AgentWorker(runner, concurrency=1, deadline_interval=None)
    resumed, backlog = _resumed_behind_a_backlog(runner, worker)
    order = Order()
    runner.add_event_listener(order)
    # When the worker makes its pass
    worker.run_once()
    # Then the resumed turn completed before any new turn got its first answer
    assert order.new_turns_answered_before(resumed, backlog) == []
    assert all(runner.turn_store.load(t).status is AgentTurnStatus.COMPLETED for t in backlog)


def test_a_polling_worker_takes_a_turn_under_way_before_new_turns_saved_earlier() -> None:
    # Given the same backlog and resumed turn, dispatched to another worker (lost with it)
    runner = AgentRunner()
    resumed, backlog = _resumed_behind_a_backlog(runner, AgentWorker(runner, concurrency=1, deadline_interval=None))
    order = Order()
    runner.add_event_listener(order)
    # When a second worker on the same store finds them by polling
    poller = AgentWorker(runner, concurrency=1, deadline_interval=None, batch_size=BACKLOG + 1)
    poller.run_once()
    # Then it stepped the resumed turn (saved last) before the new turns
    assert order.new_turns_answered_before(resumed, backlog) == []


def test_the_threads_of_a_worker_share_one_poll_schedule() -> None:
    # Given an idle worker of 50 threads that polls every 0.2 s
    store = CountingPolls()
    worker = AgentWorker(AgentRunner(turn_store=store), concurrency=50, poll_interval=0.2, deadline_interval=None)
    worker.start()
    try:
        # When it idles for a second
        time.sleep(1.0)
    finally:
        assert worker.stop(5)
    # Then the store was polled about once per interval, not once per interval per thread (250)
    assert 1 <= store.polls <= 15, store.polls
