"""The runner end to end: the support-ticket scenario, snapshots, stepping, restore and submit_resume."""

from __future__ import annotations

import json

import pytest

from agent_runner import (
    Agent,
    AgentNotFound,
    AgentResumeCommand,
    AgentRunner,
    AgentStepResult,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatResponse,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    InvalidTransitionError,
    ModelMessage,
    Phase,
    ScriptedChatModel,
    SuspensionType,
    SystemMessage,
    ToolCall,
    ToolMessage,
    TurnError,
    TurnNotFound,
    Usage,
    UserMessage,
    VersionConflictError,
    tool,
)
from tests.unit.agent_runner.turn_kit import (
    TICKET_FORM,
    TICKET_SCHEMA,
    VALID_TICKET,
    RecordingStore,
    protocol_violations,
    ticket_scenario,
    tool_messages,
)

S = AgentTurnStatus


def test_support_ticket_scenario_runs_from_form_to_approval_to_final_answer() -> None:
    # Given: the support agent
    sc = ticket_scenario()
    # When: the user asks for a ticket
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    # Then: it waits for the form, whose full schema was frozen from the registered definition
    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None
    assert turn.suspension.type is SuspensionType.USER_INPUT
    assert turn.suspension.correlation_id == "c1"
    assert turn.suspension.form is not None
    assert turn.suspension.form.key == TICKET_FORM.key
    assert turn.suspension.form.schema == TICKET_SCHEMA

    # When: invalid data is submitted
    with pytest.raises(InvalidResumeCommand) as caught:
        sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", {"affected_system": ""}))
    # Then: the schema errors are listed and the stored turn did not change
    assert any("impact_scope" in e for e in caught.value.errors)
    assert any("affected_system" in e for e in caught.value.errors)
    assert sc.store.load(turn.id) == turn

    # When: valid data is submitted
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    # Then: the data became the call's ToolMessage and the model asked for an approved tool
    [form_answer] = tool_messages(turn)
    assert form_answer.tool_call_id == "c1" and json.loads(form_answer.content) == VALID_TICKET
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.correlation_id == "c2"
    assert sc.ticket_keys == []

    # When: the call is approved
    turn = sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2").with_metadata("approverId", "u-100"))
    # Then: the tool ran once with the saved arguments and the model answered
    assert turn.status is S.COMPLETED
    assert turn.final_output == "Ticket T-1 created."
    assert sc.ticket_arguments == [VALID_TICKET]
    assert len(sc.ticket_keys) == 1
    assert sc.model.calls == 3
    assert protocol_violations(turn.messages) == []
    assert turn.pending_tool_calls == [] and turn.suspension is None


def test_every_snapshot_of_the_scenario_round_trips_through_json() -> None:
    # Given: the whole scenario run in a conversation on a store that records every save
    sc = ticket_scenario(InMemoryChatMemoryProvider())
    turn = sc.runner.run(sc.agent, "open an incident ticket", conversation_id="c-1")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    # Then: every saved snapshot survives JSON exactly
    assert len(sc.store.saved) >= 6
    assert any(t.suspension is not None and t.suspension.form is not None for t in sc.store.saved)
    assert any(t.page_actions for t in sc.store.saved)
    for snapshot in sc.store.saved:
        assert AgentTurn.model_validate_json(snapshot.model_dump_json()) == snapshot


def test_versions_of_the_scenario_go_up_by_one_per_save() -> None:
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    turn = sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    versions = [t.version for t in sc.store.saves_of(turn.id)]
    assert versions == list(range(len(versions)))
    assert turn.version == versions[-1]


def test_run_saves_the_ready_snapshot_before_calling_the_model() -> None:
    # Given: a model that looks at the store when it is called
    store = RecordingStore()
    seen_at_call: list[list[AgentTurnStatus]] = []

    def answer(request: object) -> AiMessage:
        seen_at_call.append([t.status for t in store.saved])
        return AiMessage(content="hello")

    agent = Agent(id="greeter", chat_model=ScriptedChatModel(answer))
    # When: a turn runs
    turn = AgentRunner(turn_store=store).run(agent, "hi")
    # Then: the first save was READY at version 0 holding the user message, before the model call
    first = store.saved[0]
    assert (first.status, first.version) == (S.READY, 0)
    assert [m.content for m in first.messages if isinstance(m, UserMessage)] == ["hi"]
    # (then RUNNING: taken off the queue, so that clients can tell it is being worked on)
    assert seen_at_call == [[S.READY, S.RUNNING]]
    assert turn.status is S.COMPLETED


def test_start_saves_a_ready_turn_and_runs_nothing() -> None:
    model = ScriptedChatModel([AiMessage(content="hello")])
    runner = AgentRunner()
    turn = runner.start(Agent(id="greeter", chat_model=model), "hi", history=[UserMessage(content="earlier")])
    assert turn.status is S.READY and turn.version == 0
    assert [m.content for m in turn.messages] == ["earlier", "hi"]
    assert model.calls == 0
    assert runner.turn_store.load(turn.id) == turn
    # And a later run_until_blocked does the work
    assert runner.run_until_blocked(turn).status is S.COMPLETED and model.calls == 1


def test_a_final_answer_completes_the_turn_after_one_model_call() -> None:
    model = ScriptedChatModel(
        [ChatResponse(message=AiMessage(content="hello"), usage=Usage(input_tokens=3, output_tokens=2))]
    )
    turn = AgentRunner().run(Agent(id="greeter", chat_model=model), UserMessage(content="hi"))
    assert (turn.status, turn.final_output, turn.model_iterations) == (S.COMPLETED, "hello", 1)
    assert turn.usage == Usage(input_tokens=3, output_tokens=2)
    assert model.calls == 1


def test_model_requests_start_with_the_instructions_and_carry_the_tool_specs() -> None:
    sc = ticket_scenario()
    sc.runner.run(sc.agent, "open an incident ticket")
    request = sc.model.requests[0]
    assert isinstance(request.messages[0], SystemMessage)
    assert request.messages[0].content == "Help with incidents."
    assert isinstance(request.messages[1], UserMessage)
    assert {spec.name for spec in request.tools} == {"request_user_input", "create_ticket"}


def test_explicit_history_is_sent_to_the_model_before_the_new_message() -> None:
    # Given: earlier messages passed explicitly
    history: list[ModelMessage] = [UserMessage(content="order 1001?"), AiMessage(content="It shipped.")]
    model = ScriptedChatModel([AiMessage(content="Yes.")])
    # When: a turn runs with them
    turn = AgentRunner().run(Agent(id="greeter", chat_model=model), "really?", history=history)
    # Then: the model saw history then the new message; no conversation is bound
    contents = [m.content for m in model.requests[0].messages]
    assert contents == ["order 1001?", "It shipped.", "really?"]
    assert turn.conversation_id is None


def test_tool_calls_are_saved_as_pending_before_any_execution() -> None:
    # Given: a model asking for two plain tool calls
    executed: list[str] = []

    @tool
    def lookup(q: str) -> str:
        """Look up."""
        executed.append(q)
        return q

    store = InMemoryAgentTurnStore()
    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="a", name="lookup", arguments={"q": "1"}),
                    ToolCall(id="b", name="lookup", arguments={"q": "2"}),
                ]
            ),
            AiMessage(content="ok"),
        ]
    )
    runner = AgentRunner(turn_store=store)
    turn = runner.start(Agent(id="looker", chat_model=model, tools=[lookup]), "go")
    # When: one step runs (the model step)
    result = runner.step(turn)
    # Then: the stored turn holds both calls as pending in TOOLS, and nothing ran
    stored = store.load(turn.id)
    assert [c.id for c in stored.pending_tool_calls] == ["a", "b"]
    assert stored.phase is Phase.TOOLS and stored.status is S.RUNNING
    assert executed == []
    # When: the next step runs
    runner.step(result.turn)
    # Then: exactly the first call ran and only the second is still pending
    assert executed == ["1"]
    assert [c.id for c in store.load(turn.id).pending_tool_calls] == ["b"]


def test_step_result_holds_the_response_tool_messages_error_and_new_snapshot() -> None:
    # Given: a turn whose model asks for one tool
    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return "found " + q

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="a", name="lookup", arguments={"q": "1"})]), AiMessage(content="ok")]
    )
    runner = AgentRunner()
    turn = runner.start(Agent(id="looker", chat_model=model, tools=[lookup]), "go")
    # When: the model step runs
    first = runner.step(turn)
    # Then: it reports the response and no tool messages
    assert isinstance(first, AgentStepResult)
    assert first.response is not None and first.response.message.tool_calls[0].id == "a"
    assert first.response.message.id == first.turn.messages[-1].id
    assert first.tool_messages == [] and first.error is None
    assert first.turn == runner.turn_store.load(turn.id)
    # When: the tool step runs
    second = runner.step(first.turn)
    # Then: it reports the ToolMessage and no response
    assert second.response is None and second.error is None
    assert [m.content for m in second.tool_messages] == ["found 1"]
    assert second.turn.messages[-1] == second.tool_messages[0]
    assert second.turn.version == first.turn.version + 1


def test_step_on_a_waiting_turn_changes_nothing() -> None:
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    result = sc.runner.step(turn)
    assert result.turn == turn and result.response is None and result.error is None
    assert sc.model.calls == 1
    assert sc.store.load(turn.id).version == turn.version


def test_a_new_runner_sharing_store_and_loader_continues_without_repeating_the_saved_model_call() -> None:
    # Given: a first runner that saved the model's tool calls, then went away
    executed: list[str] = []

    @tool
    def lookup(q: str) -> str:
        """Look up."""
        executed.append(q)
        return q

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="a", name="lookup", arguments={"q": "1"})]), AiMessage(content="done")]
    )
    agent = Agent(id="looker", chat_model=model, tools=[lookup])
    store, loader = InMemoryAgentTurnStore(), InMemoryAgentLoader([agent])
    first_runner = AgentRunner(turn_store=store, agent_loader=loader)
    turn = first_runner.start(agent, "go")
    first_runner.step(turn)
    assert model.calls == 1
    del first_runner
    # When: another runner restores the turn and runs it
    second_runner = AgentRunner(turn_store=store, agent_loader=loader)
    restored = second_runner.restore(turn.id)
    assert [c.id for c in restored.pending_tool_calls] == ["a"]
    finished = second_runner.run_until_blocked(restored)
    # Then: the tool ran once and the model was called only for the final answer
    assert finished.status is S.COMPLETED and finished.final_output == "done"
    assert executed == ["1"]
    assert model.calls == 2
    assert [m.role for m in model.requests[1].messages] == ["user", "assistant", "tool"]


def test_a_new_runner_continues_a_waiting_turn_after_resume() -> None:
    # Given: the scenario suspended for approval by one runner
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    # When: another runner sharing store and loader approves
    other = AgentRunner(turn_store=sc.store, agent_loader=sc.loader)
    finished = other.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    # Then: it finishes without any model call being repeated
    assert finished.status is S.COMPLETED
    assert sc.model.calls == 3 and len(sc.ticket_keys) == 1


def test_restore_of_an_unknown_turn_raises_turn_not_found() -> None:
    with pytest.raises(TurnNotFound):
        AgentRunner().restore("no-such-turn")


def test_restore_with_a_loader_that_lacks_the_agent_raises_agent_not_found() -> None:
    store = InMemoryAgentTurnStore()
    turn = AgentRunner(turn_store=store).start(Agent(id="greeter", chat_model=ScriptedChatModel([])), "hi")
    with pytest.raises(AgentNotFound):
        AgentRunner(turn_store=store, agent_loader=InMemoryAgentLoader()).restore(turn.id)


def test_an_agent_passed_to_run_is_registered_so_restore_finds_it() -> None:
    runner = AgentRunner()
    turn = runner.start(Agent(id="greeter", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hi")
    assert runner.restore(turn.id) == turn


def test_run_by_agent_id_loads_the_agent_from_the_loader() -> None:
    model = ScriptedChatModel([AiMessage(content="hello")])
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([Agent(id="greeter", version="2", chat_model=model)]))
    turn = runner.run("greeter", "hi")
    assert (turn.agent_id, turn.agent_version, turn.status) == ("greeter", "2", S.COMPLETED)
    with pytest.raises(AgentNotFound):
        runner.run("stranger", "hi")


def test_submit_resume_saves_running_and_runs_nothing_until_run_until_blocked() -> None:
    # Given: the scenario waiting for approval
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    calls_before = sc.model.calls
    # When: the approval is submitted
    submitted = sc.runner.submit_resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    # Then: the turn is saved RUNNING and neither the tool nor the model ran
    assert submitted.status is S.RUNNING
    assert sc.store.load(turn.id) == submitted
    assert sc.ticket_keys == [] and sc.model.calls == calls_before
    # When: it is run later
    finished = sc.runner.run_until_blocked(sc.runner.restore(turn.id))
    # Then: the approved call ran once and the turn completed
    assert finished.status is S.COMPLETED and len(sc.ticket_keys) == 1


def test_plain_text_suspend_then_user_input_adds_a_user_message() -> None:
    # Given: a started turn suspended with a plain-text question
    model = ScriptedChatModel([AiMessage(content="Order O-1001 shipped.")])
    runner = AgentRunner()
    turn = runner.start(Agent(id="orders", chat_model=model), "where is my order?")
    turn = runner.suspend(turn, AgentSuspension.user_input("please give the order number"))
    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None and turn.suspension.message == "please give the order number"
    assert runner.turn_store.load(turn.id) == turn
    # When: the user answers with text
    finished = runner.resume(turn.id, AgentResumeCommand.user_input("O-1001"))
    # Then: the answer is a new UserMessage the model saw last
    assert [m.content for m in finished.messages if isinstance(m, UserMessage)] == ["where is my order?", "O-1001"]
    assert model.requests[0].messages[-1].content == "O-1001"
    assert finished.status is S.COMPLETED


def test_suspend_is_refused_on_a_waiting_turn() -> None:
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    with pytest.raises(InvalidTransitionError):
        sc.runner.suspend(turn, AgentSuspension.user_input("anything else?"))
    assert sc.store.load(turn.id) == turn


def test_stepping_a_stale_snapshot_never_overwrites_the_newer_one() -> None:
    # Given: a turn advanced by one step, and the older snapshot kept aside
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="a", name="missing", arguments={})]),
            AiMessage(content="x"),
            AiMessage(content="y"),
        ]
    )
    runner = AgentRunner()
    stale = runner.start(Agent(id="looker", chat_model=model), "go")
    newer = runner.step(stale).turn
    # When: the stale snapshot is stepped again
    result = runner.step(stale)
    # Then: the save conflicted, the store still holds the newer snapshot and the result hands it back
    assert isinstance(result.error, VersionConflictError)
    assert runner.turn_store.load(stale.id) == newer
    assert result.turn == newer


def test_a_tool_message_answers_a_call_by_id_and_name() -> None:
    sc = ticket_scenario()
    turn = sc.runner.run(sc.agent, "open an incident ticket")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    turn = sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    answers = [(m.tool_call_id, m.tool_name, m.content) for m in turn.messages if isinstance(m, ToolMessage)]
    assert answers[1] == ("c2", "create_ticket", "T-1")


def test_plain_text_suspend_of_a_turn_with_pending_calls_is_refused() -> None:
    # Given: a RUNNING turn whose model asked for a call that has not run yet
    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return q

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="a", name="lookup", arguments={"q": "1"})]), AiMessage(content="done")]
    )
    runner = AgentRunner()
    turn = runner.step(runner.start(Agent(id="looker", chat_model=model, tools=[lookup]), "go")).turn
    assert turn.status is S.RUNNING and turn.pending_tool_calls
    # When: business code tries to suspend it with a question
    with pytest.raises(TurnError, match="unanswered tool call"):
        runner.suspend(turn, AgentSuspension.user_input("which one?"))
    # Then: nothing was saved and the turn still completes with a protocol-valid history
    assert runner.turn_store.load(turn.id).version == turn.version
    turn = runner.run_until_blocked(turn)
    assert turn.status is S.COMPLETED
    assert all(protocol_violations(request.messages) == [] for request in model.requests)
