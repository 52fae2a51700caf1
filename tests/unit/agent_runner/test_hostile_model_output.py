"""Unusable model output (huge, deep or unstorable tool arguments and text) never suspends a turn nor breaks the store."""

from __future__ import annotations

from typing import Any

import pytest

from agent_runner import Agent, AgentTurnStatus, AiMessage, ScriptedChatModel, ToolCall, ToolMessage
from tests.helpers.hostile import Deployment, nested
from tests.helpers.scenarios import deploy


def test_a_10mb_argument_for_an_approval_tool_is_answered_with_an_error_not_suspended(
    any_deployment: Deployment,
) -> None:
    # Given a model that asks to deploy with a 10 MB argument, then answers once more
    size = 10_000_000
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="big", name="deploy", arguments={"service": "x" * size})]),
            AiMessage(content="sorry"),
        ]
    )
    agent = Agent(id="ops", chat_model=model, tools=[deploy])
    before = any_deployment.stored_bytes()

    # When the turn runs
    turn = any_deployment.runner.run(agent, "deploy", conversation_id="c-big")

    # Then nobody is asked to approve it: the model is told the limit and the turn goes on
    assert turn.status is AgentTurnStatus.COMPLETED
    answer = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert answer.is_error and "262144 bytes" in answer.content and "not run" in answer.content
    assert turn.page_actions == [] and turn.suspension is None
    # And the value is stored once in the turn and once in the conversation, not in cards and suspensions
    assert any_deployment.stored_bytes() - before < 2.2 * size


@pytest.mark.parametrize(
    "arguments",
    [nested(65), nested(100_000), {"service": "a\ud800"}, {"serv\x00ice": "api"}, {"service": float("nan")}],
    ids=["65-deep", "100000-deep", "surrogate", "nul-key", "nan"],
)
def test_unusable_model_arguments_become_an_error_tool_message(any_deployment: Deployment, arguments: Any) -> None:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="bad", name="deploy", arguments=arguments)]), AiMessage(content="ok")]
    )
    turn = any_deployment.runner.run(Agent(id="ops", chat_model=model, tools=[deploy]), "deploy")
    assert turn.status is AgentTurnStatus.COMPLETED
    answer = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert answer.is_error and "not run" in answer.content
    assert turn.suspension is None and turn.page_actions == []
    # The model was asked again with a history it can read
    assert model.calls == 2


def test_unstorable_model_text_is_stored_with_replacement_characters(any_deployment: Deployment) -> None:
    model = ScriptedChatModel([AiMessage(content="ok \ud800 and \x00 done")])
    turn = any_deployment.runner.run(Agent(id="ops", chat_model=model), "hi", conversation_id="c-text")
    stored = any_deployment.runner.turn_store.load(turn.id)
    assert stored.final_output == "ok \ufffd and \ufffd done"
