"""The LangGraph mapping without a server: inputs, interrupts and resumes of every suspension kind, statuses."""

from __future__ import annotations

from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentSuspension,
    AgentTurn,
    AgentUserInputTool,
    AiMessage,
    AnyMessage,
    ResumeType,
    ScriptedChatModel,
    ToolCall,
    UserMessage,
    tool,
)
from workers.api.errors import ApiError, InvalidRequest
from workers.api.langgraph.mapping import (
    input_text,
    interrupt_of,
    langchain_messages,
    resume_command,
    run_status,
    thread_status,
)
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
    with pytest.raises(InvalidRequest):
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
    with pytest.raises(InvalidRequest):
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
        with pytest.raises(InvalidRequest):
            resume_command(turn, agent, bad, {})
    renamed = {"type": "edit", "edited_action": {"name": "other", "args": {}}}
    with pytest.raises(InvalidRequest):
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
        with pytest.raises(InvalidRequest):
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
