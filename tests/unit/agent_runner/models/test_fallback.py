"""FallbackChatModel: the next model when a call fails in a way worth trying elsewhere, recorded on MODEL_RESPONSE."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_runner import (
    Agent,
    AgentEventType,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
)
from agent_runner.errors import DefinitionError
from agent_runner.models import ChatRequest, FallbackChatModel
from agent_runner.models.anthropic import AnthropicChatModel
from agent_runner.models.openai import ModelAPIError, OpenAIResponsesModel
from tests.helpers import anthropic_wire, responses_wire
from tests.helpers.fake_openai import FakeChatServer, Reply
from tests.unit.agent_runner.turn_kit import START, EventLog, FakeClock


def test_an_overloaded_provider_falls_over_to_the_next_and_the_event_names_who_answered() -> None:
    # Given Claude answering 529 and an OpenAI reasoning model behind it, on two fake providers
    claude_server, openai_server = FakeChatServer(), FakeChatServer()
    claude_server.add(Reply(529, anthropic_wire.error("overloaded_error", "Overloaded")))
    openai_server.add(Reply(body=responses_wire.response(responses_wire.text("Hello from o4-mini"))))
    claude = AnthropicChatModel("claude-sonnet-4-5", api_key="k", base_url=claude_server.root_url)
    o4 = OpenAIResponsesModel("o4-mini", api_key="k", base_url=openai_server.base_url)
    try:
        runner = AgentRunner()
        events = EventLog()
        runner.add_event_listener(events)
        # When a turn runs on the fallback pair
        turn = runner.run(Agent(id="helper", chat_model=FallbackChatModel([claude, o4])), "hi")
    finally:
        for closing in (claude, o4, claude_server, openai_server):
            closing.close()
    # Then the second model answered at once, without a retry, and MODEL_RESPONSE says which one
    assert turn.status is AgentTurnStatus.COMPLETED and turn.final_output == "Hello from o4-mini"
    assert len(claude_server.requests) == 1 and len(openai_server.requests) == 1
    [response] = events.of_type(AgentEventType.MODEL_RESPONSE)
    assert response.data["model"] == "openai:o4-mini"
    assert not events.of_type(AgentEventType.RETRY_SCHEDULED)


def test_a_failure_that_repeating_will_not_fix_does_not_fall_over() -> None:
    first = ScriptedChatModel([ModelAPIError(400, "bad request")])
    second = ScriptedChatModel([AiMessage("unused")])
    with pytest.raises(ModelAPIError):
        FallbackChatModel([first, second]).generate(ChatRequest([]))
    assert second.calls == 0


def test_when_every_model_fails_the_last_failure_goes_to_the_retry_schedule() -> None:
    models = [ScriptedChatModel([RecoverableError("a")]), ScriptedChatModel([RecoverableError("b", retry_after=9)])]
    retry = RetryPolicy(initial_backoff=1, jitter=0)
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=retry), clock=FakeClock())
    turn = runner.run(Agent(id="helper", chat_model=FallbackChatModel(models)), "hi")
    # The last model's Retry-After sets the wait
    assert turn.status is AgentTurnStatus.RETRY_SCHEDULED
    assert turn.next_retry_at == START + timedelta(seconds=9)


def test_which_failures_fall_over_is_configurable() -> None:
    first = ScriptedChatModel([ModelAPIError(404, "no such model"), RecoverableError("slow")])
    second = ScriptedChatModel([AiMessage("from the second")])
    model = FallbackChatModel([first, second], fall_over_on=(ModelAPIError,))
    assert model.generate(ChatRequest([])).model == "ScriptedChatModel[1]"
    with pytest.raises(RecoverableError):
        model.generate(ChatRequest([]))


def test_the_shared_limit_counts_the_first_models_key_and_each_model_keeps_its_own() -> None:
    first = ScriptedChatModel([], rate_limit_key="anthropic:claude", output_allowance=512)
    second = ScriptedChatModel([], rate_limit_key="openai:o4-mini")
    model = FallbackChatModel([first, second])
    assert (model.rate_limit_key, model.output_allowance(), model.names) == (
        "anthropic:claude",
        512,
        ["anthropic:claude", "openai:o4-mini"],
    )


def test_fewer_than_two_models_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError, match="at least two"):
        FallbackChatModel([ScriptedChatModel([])])
