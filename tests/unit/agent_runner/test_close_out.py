"""Abnormal ends: each terminal status closes out the history from the policy's templates."""

from __future__ import annotations

from collections.abc import Sequence

from agent_runner import (
    Agent,
    AgentEventType,
    AgentExecutionPolicy,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    Budget,
    ChatResponse,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    Tool,
    ToolCall,
    ToolMessage,
    Usage,
    tool,
)
from tests.unit.agent_runner.turn_kit import EventLog, FakeClock, RecordingStore, protocol_violations

S = AgentTurnStatus
TOOL_TEMPLATE = "[{tool_name} {tool_call_id} of {turn_id}] not run: {reason}"
TURN_TEMPLATE = "Turn {turn_id} stopped early: {reason}"


def _policy(**changes: object) -> AgentExecutionPolicy:
    return AgentExecutionPolicy(
        interrupted_tool_message_template=TOOL_TEMPLATE,
        interrupted_turn_message_template=TURN_TEMPLATE,
        **changes,  # type: ignore[arg-type]
    )


def _assert_closed_out(turn: AgentTurn, unfinished: Sequence[tuple[str, str]], reason: str) -> None:
    """The history ends with one templated ToolMessage per unfinished call, then one templated AiMessage."""
    tail = turn.messages[-(len(unfinished) + 1) :]
    expected_tools = [
        TOOL_TEMPLATE.format(tool_name=name, tool_call_id=call_id, turn_id=turn.id, reason=reason)
        for call_id, name in unfinished
    ]
    assert [(m.tool_call_id, m.content) for m in tail[:-1] if isinstance(m, ToolMessage)] == [
        (call_id, text) for (call_id, _), text in zip(unfinished, expected_tools, strict=True)
    ]
    closing = tail[-1]
    assert isinstance(closing, AiMessage) and not closing.tool_calls
    assert closing.content == TURN_TEMPLATE.format(turn_id=turn.id, reason=reason)
    assert sum(isinstance(m, AiMessage) and m.content == closing.content for m in turn.messages) == 1
    assert turn.pending_tool_calls == [] and turn.suspension is None
    assert protocol_violations(turn.messages) == []


class Recorder:
    """Two plain tools, one approval tool and one that crashes, recording what ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

        @tool
        def note(text: str) -> str:
            """Write a note."""
            self.ran.append(text)
            return "noted"

        @tool(requires_approval=True)
        def publish(text: str) -> str:
            """Publish."""
            self.ran.append("publish " + text)
            return "published"

        @tool
        def crash() -> str:
            """Crash."""
            raise RuntimeError("disk on fire")

        self.tools: list[Tool] = [note, publish, crash]


def test_cancel_on_a_waiting_turn_ends_it_at_once_with_a_closing_message_per_pending_call() -> None:
    # Given: a turn waiting for approval of the first of two calls
    rec = Recorder()
    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="p1", name="publish", arguments={"text": "x"}),
                    ToolCall(id="n1", name="note", arguments={"text": "y"}),
                ]
            )
        ]
    )
    runner = AgentRunner(policy=_policy(cancellation_reason="stopped by the operator"))
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(Agent(id="writer", chat_model=model, tools=rec.tools), "go")
    assert turn.status is S.WAITING_FOR_APPROVAL
    # When: it is cancelled
    cancelled = runner.cancel(turn.id)
    # Then: it is CANCELLED and both pending calls were answered from the template, then one closing message
    assert cancelled.status is S.CANCELLED
    assert cancelled.error == "stopped by the operator"
    _assert_closed_out(cancelled, [("p1", "publish"), ("n1", "note")], "stopped by the operator")
    assert rec.ran == []
    assert runner.turn_store.load(turn.id) == cancelled
    assert events.types(turn.id)[-1] is AgentEventType.TURN_CANCELLED


def test_the_default_cancellation_reason_is_turn_cancelled_by_caller() -> None:
    model = ScriptedChatModel([])
    runner = AgentRunner()
    turn = runner.start(Agent(id="writer", chat_model=model), "go")
    cancelled = runner.cancel(turn.id)
    assert AgentExecutionPolicy().cancellation_reason == "turn cancelled by caller"
    assert cancelled.status is S.CANCELLED and cancelled.error == "turn cancelled by caller"
    closing = cancelled.messages[-1]
    assert isinstance(closing, AiMessage) and closing.content is not None
    assert "turn cancelled by caller" in closing.content
    assert model.calls == 0


def test_cancel_on_a_ready_turn_ends_it_before_any_model_call() -> None:
    model = ScriptedChatModel([AiMessage(content="never")])
    runner = AgentRunner(policy=_policy())
    turn = runner.start(Agent(id="writer", chat_model=model), "go")
    cancelled = runner.cancel(turn.id, "not needed")
    _assert_closed_out(cancelled, [], "not needed")
    assert runner.run_until_blocked(cancelled).status is S.CANCELLED
    assert model.calls == 0


def test_cancel_on_a_retry_scheduled_turn_ends_it_at_once() -> None:
    model = ScriptedChatModel([RecoverableError("timeout"), AiMessage(content="never")])
    runner = AgentRunner(policy=_policy(retry=RetryPolicy(jitter=0)), clock=FakeClock())
    turn = runner.run(Agent(id="writer", chat_model=model), "go")
    assert turn.status is S.RETRY_SCHEDULED
    cancelled = runner.cancel(turn.id)
    assert cancelled.status is S.CANCELLED and cancelled.next_retry_at is None
    _assert_closed_out(cancelled, [], "turn cancelled by caller")


def test_cancel_on_an_ended_turn_returns_it_unchanged() -> None:
    runner = AgentRunner()
    turn = runner.run(Agent(id="writer", chat_model=ScriptedChatModel([AiMessage(content="done")])), "go")
    assert runner.cancel(turn.id) == turn
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_cancel_of_a_running_turn_sets_the_flag_and_the_stepping_thread_ends_it_at_the_next_boundary() -> None:
    # Given: a tool that cancels its own turn while it runs, followed by another pending call
    flagged: list[AgentTurn] = []
    holder: dict[str, AgentRunner] = {}

    @tool
    def stop_me() -> str:
        """Cancel my own turn."""
        flagged.append(holder["runner"].cancel(AgentToolContext.current().turn_id))
        return "asked to stop"

    rec = Recorder()
    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="s1", name="stop_me", arguments={}),
                    ToolCall(id="n1", name="note", arguments={"text": "after"}),
                ]
            ),
            AiMessage(content="x"),
        ]
    )
    store = RecordingStore()
    runner = holder["runner"] = AgentRunner(turn_store=store, policy=_policy())
    # When: the turn runs
    turn = runner.run(Agent(id="writer", chat_model=model, tools=[stop_me, *rec.tools]), "go")
    # Then: cancel only flagged the RUNNING turn, without a save of its own
    [seen] = flagged
    assert seen.status is S.RUNNING and seen.cancel_requested
    # And the tool's own result was kept, the next call never ran, and the turn was closed out as CANCELLED
    assert turn.status is S.CANCELLED
    assert rec.ran == [] and model.calls == 1
    answered = [m for m in turn.messages if isinstance(m, ToolMessage)]
    assert (answered[0].tool_call_id, answered[0].content) == ("s1", "asked to stop")
    _assert_closed_out(turn, [("n1", "note")], "turn cancelled by caller")
    versions = [t.version for t in store.saves_of(turn.id)]
    assert versions == list(range(len(versions)))


class ReasonlessStore(RecordingStore):
    """A store written against the protocol before cancel requests carried a reason."""

    def request_cancel(self, turn_id: str) -> AgentTurn:  # type: ignore[override]
        return super().request_cancel(turn_id)


def _self_cancelling_agent(runner: dict[str, AgentRunner], reason: str) -> Agent:
    @tool
    def stop_me() -> str:
        """Cancel my own turn."""
        runner["runner"].cancel(AgentToolContext.current().turn_id, reason=reason)
        return "asked to stop"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="s1", name="stop_me", arguments={}), ToolCall(id="s2", name="stop_me")])]
    )
    return Agent(id="writer", chat_model=model, tools=[stop_me])


def test_the_reason_of_a_running_turns_cancel_reaches_its_error_close_out_and_event() -> None:
    holder: dict[str, AgentRunner] = {}
    events = EventLog()
    runner = holder["runner"] = AgentRunner(turn_store=RecordingStore(), policy=_policy())
    runner.add_event_listener(events)
    turn = runner.run(_self_cancelling_agent(holder, "the customer hung up"), "go")
    assert (turn.status, turn.error) == (S.CANCELLED, "the customer hung up")
    _assert_closed_out(turn, [("s2", "stop_me")], "the customer hung up")
    [ended] = events.of_type(AgentEventType.TURN_CANCELLED)
    assert ended.data["error"] == "the customer hung up"


def test_a_store_whose_cancel_request_takes_no_reason_still_cancels_with_the_default_reason() -> None:
    holder: dict[str, AgentRunner] = {}
    # mypy sees an older store as no match for the protocol; at run time it still works
    runner = holder["runner"] = AgentRunner(turn_store=ReasonlessStore(), policy=_policy())  # type: ignore[arg-type]
    turn = runner.run(_self_cancelling_agent(holder, "the customer hung up"), "go")
    assert (turn.status, turn.error) == (S.CANCELLED, "turn cancelled by caller")
    _assert_closed_out(turn, [("s2", "stop_me")], "turn cancelled by caller")


def test_a_tool_raising_an_unexpected_exception_fails_the_turn_and_closes_out_every_pending_call() -> None:
    rec = Recorder()
    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="n1", name="note", arguments={"text": "a"}),
                    ToolCall(id="k1", name="crash", arguments={}),
                    ToolCall(id="n2", name="note", arguments={"text": "b"}),
                ]
            )
        ]
    )
    runner = AgentRunner(policy=_policy())
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(Agent(id="writer", chat_model=model, tools=rec.tools), "go")
    assert turn.status is S.FAILED
    assert turn.error is not None and "disk on fire" in turn.error
    assert rec.ran == ["a"]
    _assert_closed_out(turn, [("k1", "crash"), ("n2", "note")], turn.error)
    assert events.types(turn.id)[-1] is AgentEventType.TURN_FAILED


def test_going_over_the_token_budget_ends_the_turn_with_budget_exceeded_and_closes_out() -> None:
    # Given: a budget of 100 tokens and a response that used 150 while asking for two calls
    rec = Recorder()
    model = ScriptedChatModel(
        [
            ChatResponse(
                message=AiMessage(
                    tool_calls=[
                        ToolCall(id="n1", name="note", arguments={"text": "a"}),
                        ToolCall(id="n2", name="note", arguments={"text": "b"}),
                    ]
                ),
                usage=Usage(input_tokens=100, output_tokens=50),
            )
        ]
    )
    agent = Agent(id="writer", chat_model=model, tools=rec.tools, budget=Budget(max_total_tokens=100))
    runner = AgentRunner(policy=_policy())
    events = EventLog()
    runner.add_event_listener(events)
    # When: the turn runs
    turn = runner.run(agent, "go")
    # Then: the limit check at the next step ended it before any tool ran
    assert turn.status is S.BUDGET_EXCEEDED
    assert rec.ran == []
    assert turn.usage.total_tokens == 150
    assert turn.error is not None
    _assert_closed_out(turn, [("n1", "note"), ("n2", "note")], turn.error)
    assert events.types(turn.id)[-1] is AgentEventType.BUDGET_EXCEEDED


def test_going_over_the_cost_budget_ends_the_turn_with_budget_exceeded() -> None:
    model = ScriptedChatModel(
        [
            ChatResponse(
                message=AiMessage(tool_calls=[ToolCall(id="n1", name="note", arguments={"text": "a"})]),
                usage=Usage(cost=0.5),
            )
        ]
    )
    agent = Agent(id="writer", chat_model=model, tools=Recorder().tools, budget=Budget(max_cost=0.25))
    turn = AgentRunner(policy=_policy()).run(agent, "go")
    assert turn.status is S.BUDGET_EXCEEDED
    assert turn.error is not None
    _assert_closed_out(turn, [("n1", "note")], turn.error)


def test_reaching_max_iterations_ends_the_turn_with_max_iterations_reached() -> None:
    # Given: an agent allowed two model calls whose model never stops calling tools
    rec = Recorder()
    model = ScriptedChatModel(
        lambda request: AiMessage(
            tool_calls=[ToolCall(id=f"n{len(request.messages)}", name="note", arguments={"text": "again"})]
        )
    )
    runner = AgentRunner(policy=_policy())
    events = EventLog()
    runner.add_event_listener(events)
    # When: the turn runs
    turn = runner.run(Agent(id="writer", chat_model=model, tools=rec.tools, max_iterations=2), "go")
    # Then: after two model calls and their tools, the third model step ended the turn
    assert turn.status is S.MAX_ITERATIONS_REACHED
    assert model.calls == 2 and rec.ran == ["again", "again"]
    assert turn.model_iterations == 2
    assert turn.error is not None
    _assert_closed_out(turn, [], turn.error)
    assert events.types(turn.id)[-1] is AgentEventType.MAX_ITERATIONS_REACHED


def test_reaching_max_steps_ends_the_turn_with_max_steps_reached_and_closes_out_the_rest() -> None:
    # Given: two steps allowed; the model asks for three calls
    rec = Recorder()
    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="n1", name="note", arguments={"text": "a"}),
                    ToolCall(id="n2", name="note", arguments={"text": "b"}),
                    ToolCall(id="n3", name="note", arguments={"text": "c"}),
                ]
            )
        ]
    )
    runner = AgentRunner(policy=_policy(max_steps=2))
    events = EventLog()
    runner.add_event_listener(events)
    # When: the turn runs
    turn = runner.run(Agent(id="writer", chat_model=model, tools=rec.tools), "go")
    # Then: the model step and one tool step ran; the two other calls were closed out
    assert turn.status is S.MAX_STEPS_REACHED
    assert rec.ran == ["a"]
    assert turn.steps == 2
    assert turn.error is not None
    _assert_closed_out(turn, [("n2", "note"), ("n3", "note")], turn.error)
    assert events.types(turn.id)[-1] is AgentEventType.MAX_STEPS_REACHED


def test_a_turn_that_ended_cannot_be_stepped_further() -> None:
    runner = AgentRunner(policy=_policy(max_steps=1))
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="n1", name="note", arguments={"text": "a"})]), AiMessage(content="x")]
    )
    turn = runner.run(Agent(id="writer", chat_model=model, tools=Recorder().tools), "go")
    assert turn.status is S.MAX_STEPS_REACHED
    again = runner.step(turn)
    assert again.turn == turn
    assert runner.turn_store.load(turn.id) == turn


def test_reject_does_not_close_out_the_history() -> None:
    rec = Recorder()
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})]), AiMessage(content="Fine.")]
    )
    runner = AgentRunner(policy=_policy())
    turn = runner.run(Agent(id="writer", chat_model=model, tools=rec.tools), "go")
    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("p1", reason="no"))
    assert turn.status is S.COMPLETED
    assert not any(isinstance(m, AiMessage) and m.content and "stopped early" in m.content for m in turn.messages)
    assert [m.content for m in turn.messages if isinstance(m, AiMessage)][-1] == "Fine."
