"""The package root exposes the documented names, fields and defaults; the scripted chat model behaves as documented."""

from __future__ import annotations

import pytest

import agent_runner
from agent_runner import (
    AgentConversationBusyException,
    AgentFormDefinition,
    AgentFormRequiredException,
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ChatResponse,
    RecoverableError,
    ScriptedChatModel,
    ToolSpec,
    Usage,
    UserMessage,
)

DOCUMENTED_NAMES = [
    "SystemMessage", "UserMessage", "AiMessage", "ToolMessage", "ToolCall",
    "Agent", "tool", "AgentToolContext", "AgentUserInputTool", "AgentFormDefinition", "Budget",
    "ChatModel", "ChatRequest", "ChatResponse", "Usage", "RecoverableError", "ScriptedChatModel", "ToolSpec",
    "InMemoryAgentTurnStore", "AgentTurnStore", "InMemoryAgentLoader", "AgentLoader",
    "ChatMemory", "ChatMemoryProvider", "InMemoryChatMemory", "InMemoryChatMemoryProvider",
    "AgentActionMessage", "AgentFormMessage", "ActionStatus",
    "AgentTurn", "AgentTurnStatus", "Phase", "AgentSuspension", "SuspensionType", "AgentResumeCommand",
    "AgentRunner", "AgentStepResult", "AgentExecutionPolicy", "RetryPolicy", "Middleware",
    "AgentEvent", "AgentEventType",
    "AgentRunnerError", "AgentConversationBusyException", "InvalidResumeCommand", "VersionConflictError",
    "TurnNotFound", "AgentNotFound", "AgentFormRequiredException", "FormProtocolError", "ToolError",
]  # fmt: skip

DOCUMENTED_ERRORS = [
    "AgentConversationBusyException",
    "InvalidResumeCommand",
    "VersionConflictError",
    "TurnNotFound",
    "AgentNotFound",
    "AgentFormRequiredException",
    "FormProtocolError",
    "ToolError",
    "RecoverableError",
]

TURN_FIELDS = [
    "id", "agent_id", "agent_version", "conversation_id", "parent_turn_id", "root_turn_id", "status", "phase",
    "messages", "pending_tool_calls", "suspension", "version", "model_iterations", "steps", "usage", "attempt",
    "next_retry_at", "cancel_requested", "final_output", "error", "created_at", "updated_at",
]  # fmt: skip


@pytest.mark.parametrize("name", DOCUMENTED_NAMES)
def test_every_documented_name_imports_from_the_package_root(name: str) -> None:
    assert getattr(agent_runner, name) is not None


@pytest.mark.parametrize("name", DOCUMENTED_ERRORS)
def test_every_documented_error_derives_from_agent_runner_error(name: str) -> None:
    assert issubclass(getattr(agent_runner, name), AgentRunnerError)


def test_the_turn_snapshot_has_every_documented_field() -> None:
    assert set(TURN_FIELDS) <= set(AgentTurn.model_fields)
    turn = AgentTurn(id="t", agent_id="a", root_turn_id="t")
    assert (turn.status, turn.error, turn.final_output, turn.cancel_requested) == (
        AgentTurnStatus.READY,
        None,
        None,
        False,
    )


def test_conversation_busy_error_carries_conversation_active_turn_and_status() -> None:
    error = AgentConversationBusyException("c-1", "t-1", AgentTurnStatus.RUNNING)
    assert (error.conversation_id, error.active_turn_id, error.status) == ("c-1", "t-1", AgentTurnStatus.RUNNING)


def test_form_required_exception_carries_its_form() -> None:
    form = AgentFormDefinition(key="k")
    assert AgentFormRequiredException(form).form is form


def test_recoverable_error_takes_a_message_and_an_optional_retry_after() -> None:
    assert RecoverableError("slow down", retry_after=2.5).retry_after == 2.5
    assert RecoverableError("slow down").retry_after is None
    assert str(RecoverableError("slow down")) == "slow down"


def test_usage_and_chat_response_defaults() -> None:
    assert (Usage().input_tokens, Usage().output_tokens, Usage().cost) == (0, 0, 0.0)
    assert ChatResponse(message=AiMessage(content="x")).usage == Usage()
    assert Usage(input_tokens=1, output_tokens=2, cost=0.5) + Usage(input_tokens=3) == Usage(
        input_tokens=4, output_tokens=2, cost=0.5
    )


def test_chat_request_holds_messages_and_tool_specs() -> None:
    spec = ToolSpec(name="lookup", description="Look up.", parameters={"type": "object", "properties": {}})
    request = ChatRequest(messages=[UserMessage(content="hi")], tools=[spec])
    assert request.tools == [spec] and request.on_delta is None


def test_scripted_model_returns_its_items_one_per_call_and_raises_exception_items() -> None:
    # Given: a script of a message, a response with usage, and an error
    first = AiMessage(content="one")
    usage = Usage(input_tokens=5)
    model = ScriptedChatModel([first, ChatResponse(message=AiMessage(content="two"), usage=usage), ValueError("three")])
    request = ChatRequest(messages=[UserMessage(content="hi")])
    # When / Then: each call uses the next item, a bare message wrapped in a response without usage
    assert model.generate(request) == ChatResponse(message=first)
    second = model.generate(request)
    assert (second.message.content, second.usage) == ("two", usage)
    with pytest.raises(ValueError, match="three"):
        model.generate(request)
    assert model.calls == 3
    assert model.requests == [request, request, request]


def test_scripted_model_built_from_a_function_answers_every_request_with_it() -> None:
    model = ScriptedChatModel(lambda request: AiMessage(content=f"{len(request.messages)} messages"))
    request = ChatRequest(messages=[UserMessage(content="a"), UserMessage(content="b")])
    assert model.generate(request).message.content == "2 messages"
    assert model.generate(request).message.content == "2 messages"
    assert model.calls == 2


def test_scripted_model_that_ran_out_of_items_raises() -> None:
    model = ScriptedChatModel([AiMessage(content="only")])
    request = ChatRequest(messages=[UserMessage(content="hi")])
    model.generate(request)
    with pytest.raises(Exception) as caught:
        model.generate(request)
    assert not isinstance(caught.value, RecoverableError)
