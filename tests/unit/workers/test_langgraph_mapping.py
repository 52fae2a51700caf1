"""The LangGraph mapping without a server: inputs, interrupts and resumes of every suspension kind, statuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    AnyMessage,
    InMemoryAgentLoader,
    ResumeType,
    ScriptedChatModel,
    SystemMessage,
    ToolCall,
    UserMessage,
    tool,
)
from agent_runner.persistence import EventScope
from workers.api.errors import ApiError, InvalidRequestError
from workers.api.langgraph.mapping import (
    input_text,
    interrupt_of,
    langchain_messages,
    resume_command,
    run_status,
    thread_status,
)
from workers.api.langgraph.stream_parts import RunTranslator
from workers.api.langgraph.threads import with_unprojected
from workers.api.runtime import build_runtime
from workers.api.server_settings import ApiSettings, WorkerMode
from workers.settings import WorkerSettings
from workers.views import agent_mask

FORM = AgentFormDefinition(
    key="details", description="Details.", schema={"type": "object", "properties": {"x": {"type": "string"}}}
)


@tool(requires_approval=True, sensitive=["secret"])
def deploy(service: str, secret: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def _waiting(*script: AiMessage) -> tuple[AgentTurn, Agent]:
    agent = Agent(
        id="ops",
        chat_model=ScriptedChatModel(list(script)),
        tools=[AgentUserInputTool(forms=[FORM]), deploy],
    )
    return AgentRunner().run(agent, "go"), agent


def test_a_plain_question_is_an_interrupt_of_its_text_and_resumes_with_a_string() -> None:
    runner = AgentRunner()
    agent = Agent(id="ops", chat_model=ScriptedChatModel([AiMessage(content="ok")]))
    turn = runner.suspend(runner.start(agent, "go"), AgentSuspension.user_input("Which order?"))
    assert interrupt_of(turn, agent) == {"id": turn.id, "value": "Which order?"}
    command = resume_command(turn, agent, "O-1001", {"channel": "langgraph"})
    assert (command.type, command.content, command.metadata) == (
        ResumeType.USER_INPUT,
        "O-1001",
        {"channel": "langgraph"},
    )
    assert resume_command(turn, agent, {turn.id: "O-2"}, {}).content == "O-2"
    with pytest.raises(InvalidRequestError):
        resume_command(turn, agent, {"data": 1}, {})
    assert run_status(turn) == "interrupted" and thread_status(turn, turn) == "interrupted"


def test_a_form_interrupt_carries_its_schema_and_resumes_with_the_data() -> None:
    turn, agent = _waiting(
        AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "details"})])
    )
    interrupt = interrupt_of(turn, agent)
    assert interrupt is not None and interrupt["id"] == "f1"
    assert interrupt["value"]["response_schema"] == FORM.schema == interrupt["response_schema"]
    command = resume_command(turn, agent, {"x": "y"}, {})
    assert (command.type, command.tool_call_id, command.data) == (ResumeType.USER_INPUT, "f1", {"x": "y"})
    with pytest.raises(InvalidRequestError):
        resume_command(turn, agent, "text", {})


def test_an_approval_interrupt_has_the_hitl_shape_and_an_edit_keeps_masked_values() -> None:
    call = ToolCall(id="d1", name="deploy", arguments={"service": "api", "secret": "s3"})
    turn, agent = _waiting(AiMessage(tool_calls=[call]))
    interrupt = interrupt_of(turn, agent)
    assert interrupt is not None
    assert interrupt["value"]["action_requests"][0]["args"] == {"service": "api", "secret": "***"}
    assert interrupt["value"]["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"]
    edit: dict[str, Any] = {
        "type": "edit",
        "edited_action": {"name": "deploy", "args": {"service": "web", "secret": "***"}},
    }
    command = resume_command(turn, agent, {"decisions": [edit]}, {})
    assert (command.type, command.data) == (ResumeType.EDIT_TOOL, {"service": "web", "secret": "s3"})
    assert resume_command(turn, agent, {"decisions": [{"type": "reject", "message": "no"}]}, {}).reason == "no"
    bad: Any
    for bad in (
        {"decisions": []},
        {"decisions": [{"type": "approve"}, {"type": "approve"}]},
        {"decisions": [{"type": "x"}]},
    ):
        with pytest.raises(InvalidRequestError):
            resume_command(turn, agent, bad, {})
    renamed = {"type": "edit", "edited_action": {"name": "other", "args": {}}}
    with pytest.raises(InvalidRequestError):
        resume_command(turn, agent, {"decisions": [renamed]}, {})


def test_a_turn_waiting_for_nothing_cannot_be_resumed() -> None:
    agent = Agent(id="ops", chat_model=ScriptedChatModel([AiMessage(content="done")]))
    turn = AgentRunner().run(agent, "go")
    assert interrupt_of(turn, agent) is None and run_status(turn) == "success" and thread_status(None, turn) == "idle"
    with pytest.raises(ApiError) as raised:
        resume_command(turn, agent, "x", {})
    assert raised.value.status == 409


def test_input_is_the_last_user_message_and_earlier_ones_must_be_the_history() -> None:
    history: list[AnyMessage] = [UserMessage("hi"), AiMessage(content="hello")]
    assert input_text({"messages": [{"role": "user", "content": "next"}]}, history) == "next"
    whole = {
        "messages": [
            {"type": "human", "content": "hi"},
            {"type": "ai", "content": "hello"},
            {"type": "human", "content": [{"type": "text", "text": "n"}, {"type": "text", "text": "ext"}]},
        ]
    }
    assert input_text(whole, history) == "next"
    bad: Any
    for bad in (
        {"messages": []},
        {"messages": [{"role": "assistant", "content": "x"}]},
        {"messages": [{"type": "human", "content": "other"}, {"type": "human", "content": "next"}]},
        {"text": "x"},
        "x",
        {"messages": [{"content": "no type"}]},
    ):
        with pytest.raises(InvalidRequestError):
            input_text(bad, history)
    with pytest.raises(ApiError) as image:
        input_text({"messages": [{"type": "human", "content": [{"type": "image_url", "image_url": "x"}]}]}, [])
    assert image.value.status == 501


def test_messages_are_langchain_dicts_with_masked_arguments() -> None:
    call = ToolCall(id="d1", name="deploy", arguments={"service": "api", "secret": "s3"})
    turn, agent = _waiting(AiMessage(tool_calls=[call]))
    shown = langchain_messages(turn.messages, agent_mask(agent))
    assert [m["type"] for m in shown] == ["human", "ai"]
    assert shown[1]["tool_calls"] == [
        {"id": "d1", "name": "deploy", "args": {"service": "api", "secret": "***"}, "type": "tool_call"}
    ]
    assert AgentResumeCommand.edit_tool("d1", {"a": 1}).data == {"a": 1}


def test_thread_values_show_the_newest_turns_messages_chat_memory_has_not_caught_up_with() -> None:
    earlier = UserMessage(id="u-0", content="before")
    asked = UserMessage(id="u-1", content="hi")
    answer = AiMessage(id="a-1", content="hello")
    turn = AgentTurn(
        id="t",
        agent_id="a",
        status=AgentTurnStatus.COMPLETED,
        conversation_id="c",
        messages=[SystemMessage(id="s", content="be brief"), asked, answer],
        projected_count=1,
    )
    # ChatMemory holds the user message (projected with the first save) but not yet the answer
    shown = with_unprojected([earlier, asked], turn)
    assert [m.id for m in shown] == ["u-0", "u-1", "a-1"]
    # Once projected, nothing is added twice; a turn fully projected adds nothing
    assert [m.id for m in with_unprojected([earlier, asked, answer], turn)] == ["u-0", "u-1", "a-1"]
    done = turn.model_copy(update={"projected_count": 3})
    assert [m.id for m in with_unprojected([earlier], done)] == ["u-0"]
    assert [m.id for m in with_unprojected([earlier], None)] == ["u-0"]


def test_a_stream_begun_from_an_older_snapshot_of_its_turn_shows_the_conversation_before_the_turn(
    tmp_path: Path,
) -> None:
    # Given a conversation with an ended turn, and a second turn that ran on while its stream
    # was being set up from the snapshot taken when it started
    settings = ApiSettings(
        workers=WorkerSettings(database_url=f"sqlite:///{tmp_path / 'lg.db'}"), worker_mode=WorkerMode.NONE
    )
    agent = Agent(
        id="desk", chat_model=ScriptedChatModel([AiMessage(content="first answer"), AiMessage(content="second")])
    )
    runtime = build_runtime(settings, InMemoryAgentLoader([agent]))
    try:
        runner = runtime.runner
        runner.run_until_blocked(runner.start("desk", "one", conversation_id="c"))
        started = runner.start("desk", "two", conversation_id="c")
        assert runner.run_until_blocked(started).status is AgentTurnStatus.COMPLETED
        # When its stream translates the turn's start from the older snapshot
        translator = RunTranslator(runtime, started, "thread-1", ["values"], False)
        first = runtime.turn_store.read_events(EventScope.tree(started.id))[0]
        ((mode, values),) = translator.parts(first)
        # Then the state at the start is the earlier turn and this turn's message, in order
        assert mode == "values"
        assert [(m["type"], m["content"]) for m in values["messages"]] == [
            ("human", "one"),
            ("ai", "first answer"),
            ("human", "two"),
        ]
    finally:
        runtime.stop()
