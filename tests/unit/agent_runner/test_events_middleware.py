"""Events delivered to listeners, streaming deltas, tool progress, and middleware order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentStepResult,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    Middleware,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import VALID_TICKET, EventLog, ticket_scenario

E = AgentEventType
S = AgentTurnStatus


def test_the_scenario_emits_its_events_in_order() -> None:
    # Given: the support scenario in a conversation
    sc = ticket_scenario(InMemoryChatMemoryProvider())
    # When: it runs through form, approval and answer
    turn = sc.runner.run(sc.agent, "open an incident ticket", conversation_id="c-1")
    sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    # Then: the listener saw this exact sequence
    assert sc.events.types() == [
        E.TURN_STARTED,
        E.TURN_RUNNING,
        E.MODEL_RESPONSE,
        E.TURN_SUSPENDED,
        E.TURN_RESUMED,
        E.MODEL_RESPONSE,
        E.TURN_SUSPENDED,
        E.TURN_RESUMED,
        E.TOOL_STARTED,
        E.TOOL_COMPLETED,
        E.MODEL_RESPONSE,
        E.TURN_COMPLETED,
    ]
    # And every event names the turn, its root and its conversation, with a unique id and ordered times
    events = sc.events.events
    assert {(e.turn_id, e.root_turn_id, e.conversation_id) for e in events} == {(turn.id, turn.id, "c-1")}
    assert len({e.event_id for e in events}) == len(events)
    assert [e.timestamp for e in events] == sorted(e.timestamp for e in events)
    suspended = sc.events.of_type(E.TURN_SUSPENDED)
    assert [e.data["correlation_id"] for e in suspended] == ["c1", "c2"]


def test_an_invalid_resume_emits_no_event() -> None:
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    count = len(sc.events.events)
    with pytest.raises(InvalidResumeCommand):
        sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c1"))
    assert len(sc.events.events) == count


def test_a_listener_that_raises_never_breaks_the_turn() -> None:
    # Given: a listener that always raises, registered before a recording one
    sc = ticket_scenario()

    def explode(event: AgentEvent) -> None:
        raise RuntimeError("listener bug")

    runner = AgentRunner(turn_store=sc.store, agent_loader=sc.loader)
    runner.add_event_listener(explode)
    log = EventLog()
    runner.add_event_listener(log)
    # When: the scenario runs on that runner
    turn = runner.run(sc.agent, "open an incident ticket")
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    # Then: the turn completed and later listeners still got every event
    assert turn.status is S.COMPLETED
    assert log.types()[0] is E.TURN_STARTED and log.types()[-1] is E.TURN_COMPLETED
    assert len(log.types()) == 12


class StreamingModel:
    """A chat model that streams its answer in pieces through `on_delta`."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def generate(self, request: ChatRequest) -> ChatResponse:
        for piece in self.pieces:
            if request.on_delta is not None:
                request.on_delta(piece)
        return ChatResponse(message=AiMessage(content="".join(self.pieces)))


def test_deltas_passed_to_on_delta_become_model_delta_events_before_the_response() -> None:
    runner = AgentRunner()
    log = EventLog()
    runner.add_event_listener(log)
    turn = runner.run(Agent(id="streamer", chat_model=StreamingModel(["Hel", "lo", "!"])), "hi")
    assert turn.final_output == "Hello!"
    deltas = log.of_type(E.MODEL_DELTA)
    assert [e.data["delta"] for e in deltas] == ["Hel", "lo", "!"]
    types = log.types()
    assert types.index(E.MODEL_RESPONSE) > max(i for i, t in enumerate(types) if t is E.MODEL_DELTA)
    # Each delta is its own event, stamped with the turn's state during the call
    assert len({e.event_id for e in deltas}) == 3
    running = log.of_type(E.TURN_RUNNING)[0]
    for delta in deltas:
        assert (delta.turn_id, delta.root_turn_id, delta.conversation_id) == (turn.id, turn.id, None)
        assert delta.data == {
            "status": "RUNNING",
            "version": running.data["version"],
            "delta": delta.data["delta"],
            "lease_fence": None,
        }
        assert AgentEvent.model_validate_json(delta.model_dump_json()) == delta


def test_report_progress_inside_a_tool_emits_tool_progress_between_start_and_completion() -> None:
    @tool
    def export(rows: int) -> str:
        """Export rows."""
        ctx = AgentToolContext.current()
        for done in (50, 100):
            ctx.report_progress({"percent": done})
        return "exported"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="e1", name="export", arguments={"rows": 10})]), AiMessage(content="ok")]
    )
    runner = AgentRunner()
    log = EventLog()
    runner.add_event_listener(log)
    runner.run(Agent(id="exporter", chat_model=model, tools=[export]), "go")
    progress = log.of_type(E.TOOL_PROGRESS)
    assert [e.data["progress"] for e in progress] == [{"percent": 50}, {"percent": 100}]
    assert all(e.data["tool_call_id"] == "e1" for e in progress)
    types = log.types()
    assert types.index(E.TOOL_STARTED) < types.index(E.TOOL_PROGRESS) < types.index(E.TOOL_COMPLETED)


class Tracing(Middleware):
    """Records entry and exit of every hook under its name."""

    def __init__(self, name: str, trace: list[str]) -> None:
        self.name = name
        self.trace = trace

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        self.trace.append(f"{self.name}.model>")
        response = call_next(request)
        self.trace.append(f"{self.name}.model<")
        return response

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        self.trace.append(f"{self.name}.tool>")
        result = call_next(tool_call)
        self.trace.append(f"{self.name}.tool<")
        return result

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        self.trace.append(f"{self.name}.step>")
        result = call_next(turn)
        self.trace.append(f"{self.name}.step<")
        return result


def test_middleware_wraps_steps_model_calls_and_tool_calls_with_the_first_registered_outermost() -> None:
    # Given: two tracing middleware and a turn of one model call, one tool call and a final answer
    trace: list[str] = []

    @tool
    def ping() -> str:
        """Ping."""
        trace.append("tool")
        return "pong"

    def answer(request: ChatRequest) -> AiMessage:
        trace.append("model")
        if len(request.messages) == 1:
            return AiMessage(tool_calls=[ToolCall(id="p1", name="ping", arguments={})])
        return AiMessage(content="done")

    runner = AgentRunner(middleware=[Tracing("A", trace), Tracing("B", trace)])
    # When: the turn runs
    turn = runner.run(Agent(id="pinger", chat_model=ScriptedChatModel(answer), tools=[ping]), "go")
    # Then: every hook nests B inside A, and model and tool calls nest inside the step hooks
    assert turn.status is S.COMPLETED
    model_step = ["A.step>", "B.step>", "A.model>", "B.model>", "model", "B.model<", "A.model<", "B.step<", "A.step<"]
    tool_step = ["A.step>", "B.step>", "A.tool>", "B.tool>", "tool", "B.tool<", "A.tool<", "B.step<", "A.step<"]
    assert trace == model_step + tool_step + model_step


class CannedAnswer(Middleware):
    """Answers every model call itself (a cache hit)."""

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        return ChatResponse(message=AiMessage(content="from cache"))


def test_a_model_middleware_may_answer_without_calling_the_model_and_the_runner_records_it() -> None:
    model = ScriptedChatModel([AiMessage(content="from model")])
    turn = AgentRunner(middleware=[CannedAnswer()]).run(Agent(id="cached", chat_model=model), "hi")
    assert (turn.status, turn.final_output, model.calls) == (S.COMPLETED, "from cache", 0)


def test_a_step_middleware_sees_each_step_result_with_its_snapshot() -> None:
    seen: list[tuple[AgentTurnStatus, int]] = []

    class Watch(Middleware):
        def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
            result = call_next(turn)
            seen.append((result.turn.status, result.turn.version))
            return result

    runner = AgentRunner(middleware=[Watch()])
    turn = runner.run(Agent(id="w", chat_model=ScriptedChatModel([AiMessage(content="ok")])), "hi")
    assert seen == [(S.COMPLETED, turn.version)]


class ForgeResult(Middleware):
    """Tries to report a different outcome than the step had."""

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        result = call_next(turn)
        forged = result.turn.model_copy(update={"status": S.COMPLETED, "final_output": "forged"})
        return AgentStepResult(turn=forged)


class ForgeInput(Middleware):
    """Tries to hand the step a rewritten snapshot."""

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        return call_next(turn.model_copy(update={"messages": [], "status": S.COMPLETED}))


class SkipStep(Middleware):
    """Tries to skip the step altogether."""

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        return AgentStepResult(turn=turn)


@pytest.mark.parametrize("middleware", [ForgeResult(), ForgeInput(), SkipStep()], ids=lambda m: type(m).__name__)
def test_step_middleware_cannot_change_the_state_flow(middleware: Middleware) -> None:
    # Given: a turn that must suspend for approval, run through a meddling step middleware
    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="p1", name="pay", arguments={"amount": 1})]), AiMessage(content="done")]
    )
    runner = AgentRunner(middleware=[middleware])
    # When: the turn runs
    turn = runner.run(Agent(id="payer", chat_model=model, tools=[pay]), "go")
    # Then: it followed its own flow, and what run returned is what the store holds
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn == runner.turn_store.load(turn.id)
    assert [m.role for m in turn.messages] == ["user", "assistant"]
