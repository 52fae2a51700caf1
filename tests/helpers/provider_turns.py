"""One scenario played on each provider adapter: a retry, a form, an approval, and the turn finished by another process.

The provider is a `FakeChatServer` scripted with that provider's wire format. Each model
call that reasons leaves provider parts (signed thinking, an encrypted reasoning item, a
thought signature) that the last call must carry back verbatim, which `carried_back`
reads from the request the fake server received.

`python -m tests.helpers.provider_turns <provider> <store url> <server url> <turn id> <call id>`
approves the pending call in a fresh process and prints the turn's final status.
"""

from __future__ import annotations

import sys
from typing import Any

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentFormRequiredException,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStore,
    ChatModel,
    InMemoryAgentLoader,
    RetryPolicy,
    tool,
)
from agent_runner.models.anthropic import AnthropicChatModel
from agent_runner.models.gemini import GeminiChatModel
from agent_runner.models.openai import OpenAIResponsesModel
from tests.helpers import anthropic_wire, gemini_wire, responses_wire
from tests.helpers.fake_openai import Reply

PROVIDERS = ("anthropic", "openai_responses", "gemini")
ADDRESS = {"street": "Main St 1", "zip": "12345"}
SHIPPING_FORM = AgentFormDefinition(
    key="shipping_address",
    description="Where to ship",
    schema={
        "type": "object",
        "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
        "required": ["street", "zip"],
    },
)
SHIP_CALL = {"anthropic": "toolu_ship", "openai_responses": "call_ship", "gemini": "fc_ship"}
DEPLOY_CALL = {"anthropic": "toolu_deploy", "openai_responses": "call_deploy", "gemini": "fc_deploy"}
SECOND_THINKING = {**anthropic_wire.THINKING, "thinking": "Shipped; now deploy.", "signature": "Er0BCgIYAhIMsecond"}
SECOND_REASONING = {**responses_wire.REASONING, "id": "rs_02", "encrypted_content": "gAAAAABsecond=="}
SECOND_SIGNATURE = "c2lnbmVkLXRob3VnaHQtb2Ytc3RlcC0y"


@tool
def ship(order_id: str) -> str:
    """Ship an order (asks for the address first)."""
    data = AgentToolContext.current().get_submitted_form_data()
    if not data:
        raise AgentFormRequiredException(SHIPPING_FORM)
    return f"shipped {order_id} to {data['street']}"


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def model_for(provider: str, server_url: str) -> ChatModel:
    """The provider's adapter pointed at the fake server (its root URL)."""
    if provider == "anthropic":
        return AnthropicChatModel("claude-sonnet-4-5", api_key="k", base_url=server_url)
    if provider == "openai_responses":
        return OpenAIResponsesModel("o4-mini", api_key="k", base_url=f"{server_url}/v1")
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server_url))
    return GeminiChatModel("gemini-2.5-flash", client=client)


def runner_for(provider: str, server_url: str, turns: AgentTurnStore) -> tuple[AgentRunner, Agent]:
    """A runner on `turns` that knows the provider's agent, as each process builds it."""
    agent = Agent(id=f"ops-{provider}", chat_model=model_for(provider, server_url), tools=[ship, deploy])
    policy = AgentExecutionPolicy(retry=RetryPolicy(jitter=0))
    return AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([agent]), policy=policy), agent


def script(provider: str) -> list[Reply]:
    """The provider's answers: overloaded, a call of `ship` (reasoned), a call of `deploy` (reasoned), the answer."""
    if provider == "anthropic":
        a = anthropic_wire
        return [
            Reply(529, a.error("overloaded_error", "Overloaded")),
            Reply(body=a.message(a.THINKING, a.tool_use(SHIP_CALL[provider], "ship", {"order_id": "O-1"}))),
            Reply(body=a.message(SECOND_THINKING, a.tool_use(DEPLOY_CALL[provider], "deploy", {"service": "web"}))),
            Reply(body=a.message(a.text("Shipped and deployed."))),
        ]
    if provider == "openai_responses":
        r = responses_wire
        return [
            Reply(503, {"error": {"message": "The engine is currently overloaded", "type": "server_error"}}),
            Reply(body=r.response(r.REASONING, r.function_call(SHIP_CALL[provider], "ship", '{"order_id": "O-1"}'))),
            Reply(
                body=r.response(
                    SECOND_REASONING, r.function_call(DEPLOY_CALL[provider], "deploy", '{"service": "web"}')
                )
            ),
            Reply(body=r.response(r.text("Shipped and deployed."))),
        ]
    g = gemini_wire
    return [
        Reply(503, g.error(503, "UNAVAILABLE", "The model is overloaded")),
        Reply(body=g.response(g.function_call("ship", {"order_id": "O-1"}, SHIP_CALL[provider], g.SIGNATURE))),
        Reply(body=g.response(g.function_call("deploy", {"service": "web"}, DEPLOY_CALL[provider], SECOND_SIGNATURE))),
        Reply(body=g.response({"text": "Shipped and deployed."})),
    ]


def expected_carried_back(provider: str) -> list[Any]:
    """What the last call must carry back, in order: the two reasoned steps' provider parts."""
    if provider == "anthropic":
        return [anthropic_wire.THINKING, SECOND_THINKING]
    if provider == "openai_responses":
        return [responses_wire.REASONING, SECOND_REASONING]
    return [gemini_wire.SIGNATURE, SECOND_SIGNATURE]


def carried_back(provider: str, body: dict[str, Any]) -> list[Any]:
    """The provider parts found in a request body the fake server received."""
    if provider == "anthropic":
        return [
            block
            for message in body["messages"]
            if message["role"] == "assistant"
            for block in message["content"]
            if block["type"] == "thinking"
        ]
    if provider == "openai_responses":
        return [item for item in body["input"] if item.get("type") == "reasoning"]
    return [
        part["thoughtSignature"]
        for content in body["contents"]
        for part in content["parts"]
        if "thoughtSignature" in part
    ]


def main(provider: str, store_url: str, server_url: str, turn_id: str, call_id: str) -> None:
    import store

    with store.SqlAgentTurnStore(store_url) as turns:
        runner, _ = runner_for(provider, server_url, turns)
        turn = runner.resume(turn_id, AgentResumeCommand.approve_tool(call_id))
        print(turn.status.value, turn.final_output)


if __name__ == "__main__":
    main(*sys.argv[1:6])
