"""Work a tool started elsewhere (`OperationPending`): the turn waits holding no thread, polls back off, a cancel reaches the work."""

from __future__ import annotations

from typing import Any

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentExecutionPolicy,
    AgentRunner,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentTurnStore,
    OperationPending,
    ScriptedChatModel,
    SuspensionType,
    Tool,
    ToolCall,
    ToolError,
    ToolMessage,
)
from agent_runner.operations import next_poll
from tests.unit.agent_runner.turn_kit import FakeClock, poll_until_settled

S = AgentTurnStatus


class Jobs:
    """A service that runs jobs elsewhere: each is done after `polls_needed` looks, or fails."""

    def __init__(self, polls_needed: int, fails: bool = False) -> None:
        self.polls_needed = polls_needed
        self.fails = fails
        self.started: list[str] = []
        self.looks: list[str] = []
        self.cancelled: list[dict[str, Any]] = []

    def render(self, report: str) -> str:
        state = AgentToolContext.current().get_tool_state()
        if "operation" not in state:
            job = f"job-{len(self.started) + 1}"
            self.started.append(job)
            raise OperationPending({"job": job, "report": report}, status="queued")
        job = state["operation"]["job"]
        self.looks.append(job)
        if len(self.looks) < self.polls_needed:
            raise OperationPending(state["operation"], status=f"rendering ({len(self.looks)})")
        if self.fails:
            raise ToolError(f"{job} failed: out of paper")
        return f"{job}: {report} rendered"


def build(jobs: Jobs, *, idempotent: bool = True) -> tuple[AgentRunner, Agent, FakeClock, list[AgentEvent]]:
    class RenderTool(Tool):
        def cancel_operation(self, handle: dict[str, Any]) -> None:
            jobs.cancelled.append(handle)

    render = RenderTool(jobs.render, name="render", idempotent=idempotent)
    script = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="render", arguments={"report": "q3"})]), AiMessage(content="ok")]
    )
    agent = Agent(id="reports", chat_model=script, tools=[render])
    clock = FakeClock()
    runner = AgentRunner(turn_store=InMemoryAgentTurnStore(), policy=AgentExecutionPolicy(), clock=clock)
    events: list[AgentEvent] = []
    runner.add_event_listener(events.append)
    return runner, agent, clock, events


def test_the_turn_waits_without_a_retry_attempt_and_polls_back_off_until_the_work_is_done() -> None:
    jobs = Jobs(polls_needed=3)
    runner, agent, clock, events = build(jobs)

    def waits(turn: AgentTurn) -> None:
        assert turn.suspension is not None and turn.suspension.type is SuspensionType.RETRY
        assert turn.suspension.metadata["reason"] == "operation" and turn.attempt == 0
        assert turn.tool_state["c1"]["operation"] == {"job": "job-1", "report": "q3"}

    turn, delays = poll_until_settled(runner, clock, runner.run(agent, "render q3"), waits)

    assert turn.status is S.COMPLETED, turn.error
    assert delays == [1.0, 2.0, 4.0]
    assert jobs.started == ["job-1"] and jobs.looks == ["job-1"] * 3
    assert [m.content for m in turn.messages if isinstance(m, ToolMessage)] == ["job-1: q3 rendered"]
    assert turn.tool_state == {}
    resumed = [e.data["reason"] for e in events if e.type is AgentEventType.TURN_RESUMED]
    assert resumed == ["poll due"] * 3


def test_failed_work_is_an_error_tool_message() -> None:
    jobs = Jobs(polls_needed=1, fails=True)
    runner, agent, clock, _ = build(jobs)

    turn = runner.run(agent, "render q3")
    clock.advance(1)
    turn = runner.run_until_blocked(runner.restore(turn.id))

    [message] = [m for m in turn.messages if isinstance(m, ToolMessage)]
    assert message.is_error and message.content == "job-1 failed: out of paper"


def test_a_non_idempotent_call_is_polled_not_reconciled() -> None:
    jobs = Jobs(polls_needed=2)
    runner, agent, clock, _ = build(jobs, idempotent=False)

    turn = runner.run(agent, "render q3")
    assert turn.started_call_ids == [] and turn.status is S.RETRY_SCHEDULED
    clock.advance(1)
    turn = runner.run_until_blocked(runner.restore(turn.id))
    clock.advance(2)
    turn = runner.run_until_blocked(runner.restore(turn.id))

    assert turn.status is S.COMPLETED, turn.error
    assert jobs.started == ["job-1"]


def test_a_cancelled_turn_cancels_the_work() -> None:
    jobs = Jobs(polls_needed=5)
    runner, agent, _, _ = build(jobs)
    turn = runner.run(agent, "render q3")

    cancelled = runner.cancel(turn.id, "not needed")

    assert cancelled.status is S.CANCELLED
    assert jobs.cancelled == [{"job": "job-1", "report": "q3"}]


def test_polls_back_off_to_a_minute_and_never_come_sooner_than_the_work_asks() -> None:
    assert [next_poll(n, None) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert next_poll(3, 0.5) == 8 and next_poll(0, 5) == 5 and next_poll(0, 3600) == 60
