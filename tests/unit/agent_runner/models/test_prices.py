"""Costs from the genai-prices list when no `price=` is given, cached tokens included; budgets use them."""

from __future__ import annotations

import pytest
from genai_prices import Usage as PriceUsage
from genai_prices import calc_price

from agent_runner import Agent, AgentRunner, AgentTurnStatus, Budget, Usage, tool
from agent_runner.errors import DefinitionError
from agent_runner.messages import UserMessage
from agent_runner.models import ChatRequest
from agent_runner.models._adapter import priced
from agent_runner.models.anthropic import AnthropicChatModel
from agent_runner.models.openai import OpenAIChatModel
from tests.helpers import anthropic_wire as wire
from tests.helpers.fake_openai import FakeChatServer, Reply, completion


def test_a_known_model_is_priced_from_the_list_with_its_cached_tokens_at_their_own_rate() -> None:
    plain = priced(Usage(1_000_000, 100_000), None, "anthropic", "claude-sonnet-4-5")
    cached = priced(Usage(1_000_000, 100_000, cache_read_tokens=800_000), None, "anthropic", "claude-sonnet-4-5")
    expected = calc_price(
        PriceUsage(input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=800_000),
        "claude-sonnet-4-5",
        provider_id="anthropic",
    )
    assert cached.cost == pytest.approx(float(expected.total_price))
    assert 0 < cached.cost < plain.cost


def test_an_explicit_price_wins_and_an_unknown_model_costs_nothing() -> None:
    assert priced(Usage(1_000_000, 1_000_000), (2.0, 8.0), "openai", "gpt-4o-mini").cost == pytest.approx(10.0)
    assert priced(Usage(500, 50), None, "openai", "my-local-llama").cost == 0.0
    with pytest.raises(DefinitionError, match="price"):
        AnthropicChatModel("claude-sonnet-4-5", api_key="k", price=(1.0,))  # type: ignore[arg-type]


def test_the_chat_completions_adapter_prices_a_known_model_with_its_cached_tokens() -> None:
    server = FakeChatServer()
    body = completion("hi", usage=(2000, 100))
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 1024}
    server.add(Reply(body=body))
    model = OpenAIChatModel("gpt-4o-mini", base_url=server.base_url, api_key="k")
    try:
        usage = model.generate(ChatRequest([UserMessage("hi")])).usage
    finally:
        model.close()
        server.close()
    expected = calc_price(
        PriceUsage(input_tokens=2000, output_tokens=100, cache_read_tokens=1024), "gpt-4o-mini", provider_id="openai"
    )
    assert usage.cache_read_tokens == 1024
    assert usage.cost == pytest.approx(float(expected.total_price))


def test_a_cost_budget_ends_a_turn_priced_from_the_list() -> None:
    # Given Claude priced from the list, a big cached history each step, and a budget of a cent
    usage = {"input_tokens": 2000, "output_tokens": 500, "cache_read_input_tokens": 30_000}
    server = FakeChatServer(
        answer=lambda _: Reply(body=wire.message(wire.tool_use("toolu_x", "note", {}), usage=usage))
    )

    @tool
    def note() -> str:
        """Take a note."""
        return "noted"

    model = AnthropicChatModel("claude-sonnet-4-5", api_key="k", base_url=server.root_url)
    try:
        agent = Agent(id="writer", chat_model=model, tools=[note], budget=Budget(max_cost=0.05))
        turn = AgentRunner().run(agent, "go")
    finally:
        model.close()
        server.close()
    # Then the budget trips after the calls whose listed price passes it
    assert turn.status is AgentTurnStatus.BUDGET_EXCEEDED
    assert turn.usage.cost > 0.05
    assert turn.usage.cache_read_tokens == 30_000 * len(server.requests)
