"""`TurnTranslator`: a turn's events, as a runner emits them, into the protocol-neutral steps every chat protocol writes."""

from __future__ import annotations

from typing import Any

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentSuspension,
    AiMessage,
    ChatRequest,
    FinalAnswer,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    ToolCall,
    tool,
)
from tests.clients.chat_agents import build_agents
from workers.api.protocols.steps import (
    ApprovalAnswered,
    ApprovalRequested,
    FormRequested,
    QuestionAsked,
    Recovering,
    Step,
    StepFinished,
    StepStarted,
    TextDelta,
    TextEnded,
    ToolCallArgs,
    ToolCallAvailable,
    ToolCallStarted,
    ToolResult,
    TurnContent,
    TurnFailed,
    TurnFinished,
    TurnTranslator,
)
from workers.views import agent_mask


class Recorded:
    """A runner of the chat agents on an in-memory store, with every event it emitted."""

    def __init__(self) -> None:
        self.store = InMemoryAgentTurnStore()
        self.runner = AgentRunner(turn_store=self.store)
        self.agent = build_agents()[0]
        self.events: list[AgentEvent] = []
        self.runner.add_event_listener(self.events.append)

    def translator(self, turn_id: str) -> TurnTranslator:
        return TurnTranslator(turn_id, TurnContent(self.store.load, agent_mask(self.agent)))

    def steps(self, turn_id: str, events: list[AgentEvent] | None = None) -> list[Step]:
        translator = self.translator(turn_id)
        return [step for event in (self.events if events is None else events) for step in translator.translate(event)]


def kinds(steps: list[Step]) -> list[str]:
    return [type(step).__name__ for step in steps]


def text_of(steps: list[Step]) -> str:
    return "".join(step.delta for step in steps if isinstance(step, TextDelta))


def test_a_streamed_answer_is_one_step_with_its_text_delta_by_delta() -> None:
    recorded = Recorded()
    turn = recorded.runner.run(recorded.agent, "hello world")
    steps = recorded.steps(turn.id)
    assert kinds(steps) == ["StepStarted", "TextStarted"] + ["TextDelta"] * 4 + [
        "TextEnded",
        "StepFinished",
        "TurnFinished",
    ]
    assert text_of(steps) == "Hello! You said world."
    finished = steps[-1]
    assert isinstance(finished, TurnFinished) and finished.status == "COMPLETED" and not finished.waiting
    assert finished.final_output == "Hello! You said world."


def test_text_whose_deltas_were_missed_comes_whole_from_the_model_response() -> None:
    recorded = Recorded()
    turn = recorded.runner.run(recorded.agent, "hello world")
    durable = [e for e in recorded.events if e.type is not AgentEventType.MODEL_DELTA]
    steps = recorded.steps(turn.id, durable)
    assert [s for s in steps if isinstance(s, TextDelta)] == [TextDelta(steps[1].text_id, "Hello! You said world.")]  # type: ignore[union-attr]


def _delta(turn_id: str, text: str, fence: int) -> AgentEvent:
    return AgentEvent(
        type=AgentEventType.MODEL_DELTA, turn_id=turn_id, data={"delta": text, "version": 3, "lease_fence": fence}
    )


def test_a_model_call_re_run_after_its_worker_died_shows_its_text_once() -> None:
    # Given deltas of a call whose worker died after "Hello wor", then the re-run's deltas
    # (another lease) from the start, and the response
    turn = "t-1"
    events = [_delta(turn, "Hello", 1), _delta(turn, " wor", 1)]
    events += [_delta(turn, "Hello", 2), _delta(turn, " wor", 2), _delta(turn, "ld", 2)]
    events.append(
        AgentEvent(
            type=AgentEventType.MODEL_RESPONSE,
            turn_id=turn,
            data={"message_id": "m", "content": "Hello world!", "tool_calls": [], "version": 4},
        )
    )
    translator = TurnTranslator(turn, TurnContent(_no_turns, lambda call: {}))
    steps = [step for event in events for step in translator.translate(event)]
    # Then the text is shown once, each piece when it first came
    assert [s.delta for s in steps if isinstance(s, TextDelta)] == ["Hello", " wor", "ld", "!"]
    assert kinds(steps).count("TextStarted") == 1 and kinds(steps).count("TextEnded") == 1


def _no_turns(turn_id: str) -> Any:
    raise AssertionError("no snapshot is needed for text")


def test_an_approval_shows_the_call_waits_and_then_its_decision_and_result() -> None:
    recorded = Recorded()
    waiting = recorded.runner.run(recorded.agent, "deploy billing")
    before = recorded.steps(waiting.id)
    call_id = waiting.suspension.correlation_id if waiting.suspension else None
    assert call_id is not None
    assert kinds(before) == [
        "StepStarted",
        "ToolCallStarted",
        "ToolCallArgs",
        "ToolCallAvailable",
        "StepFinished",
        "ApprovalRequested",
        "TurnFinished",
    ]
    started, args, available, _, requested, paused = before[1:]
    assert isinstance(started, ToolCallStarted) and started.name == "deploy"
    assert isinstance(args, ToolCallArgs) and args.delta == '{"service":"billing"}'
    assert isinstance(available, ToolCallAvailable) and available.arguments == {"service": "billing"}
    assert requested == ApprovalRequested(call_id, "deploy", {"service": "billing"}, requested.message)  # type: ignore[union-attr]
    assert isinstance(paused, TurnFinished) and paused.waiting and paused.status == "WAITING_FOR_APPROVAL"
    # When it is approved, the same translator goes on with the decision and the result
    seen = len(recorded.events)
    recorded.runner.resume(waiting.id, AgentResumeCommand.approve_tool(call_id))
    translator = recorded.translator(waiting.id)
    for event in recorded.events[:seen]:
        translator.translate(event)
    after = [step for event in recorded.events[seen:] for step in translator.translate(event)]
    assert after[0] == ApprovalAnswered(call_id, True, None)
    result = after[1]
    assert isinstance(result, ToolResult) and result.content == "deployed billing" and not result.is_error
    assert isinstance(after[2], StepStarted) and after[2].name == "model-2"
    assert text_of(after) == "deployed billing"
    assert isinstance(after[-1], TurnFinished) and after[-1].status == "COMPLETED"


def test_a_rejection_is_answered_then_its_reason_is_the_result() -> None:
    recorded = Recorded()
    waiting = recorded.runner.run(recorded.agent, "deploy billing")
    assert waiting.suspension is not None and waiting.suspension.correlation_id is not None
    call_id = waiting.suspension.correlation_id
    seen = len(recorded.events)
    recorded.runner.resume(waiting.id, AgentResumeCommand.reject_tool(call_id, "not today"))
    steps = recorded.steps(waiting.id, recorded.events[seen:])
    assert steps[0] == ApprovalAnswered(call_id, False, "not today")
    assert isinstance(steps[1], ToolResult) and "not today" in steps[1].content


def test_a_form_carries_the_frozen_schema() -> None:
    recorded = Recorded()
    waiting = recorded.runner.run(recorded.agent, "ticket")
    steps = recorded.steps(waiting.id)
    form = next(s for s in steps if isinstance(s, FormRequested))
    assert form.key == "ticket_details" and form.schema["required"] == ["system", "scope"]
    assert isinstance(steps[-1], TurnFinished) and steps[-1].waiting


def test_a_failed_turn_closes_what_is_open_and_fails() -> None:
    recorded = Recorded()
    failed = recorded.runner.start(recorded.agent, "fail")
    try:
        recorded.runner.run_until_blocked(failed)
    except ValueError:
        pass  # in this thread the model's exception reaches the caller; the turn is saved FAILED
    steps = recorded.steps(failed.id)
    assert isinstance(steps[-1], TurnFailed) and "the model broke down" in steps[-1].error


def test_events_of_other_turns_of_the_tree_are_not_shown() -> None:
    recorded = Recorded()
    turn = recorded.runner.run(recorded.agent, "hello world")
    child_events = [e.model_copy(update={"turn_id": "child"}) for e in recorded.events]
    assert recorded.steps(turn.id, child_events) == []


def test_a_client_joining_mid_call_is_shown_the_text_so_far() -> None:
    translator = TurnTranslator("t-1", TurnContent(_no_turns, lambda call: {}))
    for event in [_delta("t-1", "Hello", 1), _delta("t-1", " there", 1)]:
        translator.translate(event)
    reopened = translator.reopen()
    assert kinds(reopened) == ["StepStarted", "TextStarted", "TextDelta"]
    assert isinstance(reopened[2], TextDelta) and reopened[2].delta == "Hello there"
    assert kinds(translator.close()) == ["TextEnded", "StepFinished"]
    assert not any(isinstance(s, TextEnded | StepFinished) for s in translator.close())


def test_a_plain_question_waits_for_the_next_user_message() -> None:
    recorded = Recorded()
    queued = recorded.runner.start(recorded.agent, "hello world")
    recorded.runner.suspend(queued, AgentSuspension.user_input("which order?"))
    steps = recorded.steps(queued.id)
    assert steps[0] == QuestionAsked("which order?")
    assert isinstance(steps[1], TurnFinished) and steps[1].waiting and steps[1].status == "WAITING_FOR_USER"


def test_a_call_whose_outcome_is_unknown_is_shown_as_an_approval_as_in_older_events() -> None:
    # Given the events of a call waiting for a person, its TURN_SUSPENDED written as an unknown
    # outcome (TOOL_OUTCOME_UNKNOWN), and as events written before that type existed said it
    recorded = Recorded()
    waiting = recorded.runner.run(recorded.agent, "deploy billing")
    call_id = waiting.suspension.correlation_id if waiting.suspension else None
    assert call_id is not None

    def written_as(suspension_type: str) -> list[AgentEvent]:
        return [
            e.model_copy(update={"data": {**e.data, "suspension_type": suspension_type, "kind": "outcome_unknown"}})
            if e.type is AgentEventType.TURN_SUSPENDED
            else e
            for e in recorded.events
        ]

    # Then both ask the chat client for a decision on the call, as an approval does
    for suspension_type in ("TOOL_OUTCOME_UNKNOWN", "TOOL_APPROVAL"):
        steps = recorded.steps(waiting.id, written_as(suspension_type))
        assert kinds(steps)[-2:] == ["ApprovalRequested", "TurnFinished"]
        requested = steps[-2]
        assert isinstance(requested, ApprovalRequested)
        assert (requested.call_id, requested.name, requested.arguments) == (call_id, "deploy", {"service": "billing"})


def test_a_final_answer_after_a_limit_is_text_then_the_limit_status_with_it_as_output() -> None:
    store = InMemoryAgentTurnStore()
    runner = AgentRunner(turn_store=store)
    events: list[AgentEvent] = []
    runner.add_event_listener(events.append)

    @tool
    def look() -> str:
        """Look."""
        return "seen"

    def model(request: ChatRequest) -> AiMessage:
        if request.tools:
            return AiMessage("", [ToolCall(f"c{len(request.messages)}", "look", {})])
        return AiMessage("Looked once; the rest is left.")

    agent = Agent(
        "looker", chat_model=ScriptedChatModel(model), tools=[look], max_iterations=1, final_answer=FinalAnswer()
    )
    turn = runner.run(agent, "look around")
    steps = [
        s for e in events for s in TurnTranslator(turn.id, TurnContent(store.load, agent_mask(agent))).translate(e)
    ]
    assert text_of(steps) == "Looked once; the rest is left."
    finished = steps[-1]
    assert isinstance(finished, TurnFinished) and finished.status == "MAX_ITERATIONS_REACHED"
    assert finished.final_output == "Looked once; the rest is left."


def test_a_takeover_is_a_recovering_step() -> None:
    recorded = Recorded()
    turn = recorded.runner.start(recorded.agent, "hello world")
    event = AgentEvent(
        type=AgentEventType.TURN_RECOVERING,
        turn_id=turn.id,
        root_turn_id=turn.id,
        data={"status": "RUNNING", "version": 3, "recoveries": 2, "max_recoveries": 3},
    )
    assert recorded.steps(turn.id, [event]) == [Recovering(recoveries=2, max_recoveries=3)]
