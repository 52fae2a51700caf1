"""An agent on the real OpenAI adapter pointed at a local fake provider, for the shared model limit tests.

Worker processes load it through `AGENT_RUNNER_AGENT_LOADER=tests.helpers.limited_agents:build_loader`
and find the provider at `PROVIDER_URL_VARIABLE`.
"""

from __future__ import annotations

import os

from agent_runner import Agent, InMemoryAgentLoader
from agent_runner.models.openai import OpenAIChatModel

PROVIDER_URL_VARIABLE = "LIMITS_TEST_PROVIDER_URL"
MODEL = "limited-model"
LIMIT_KEY = f"openai:{MODEL}"
"""The key the agent's model counts against (the adapter's default)."""


def limited_agent(base_url: str) -> Agent:
    model = OpenAIChatModel(MODEL, base_url=base_url, api_key="test-key", timeout=10.0, max_tokens=16)
    return Agent(id="limited", instructions="Answer in one word.", chat_model=model)


def build_loader() -> InMemoryAgentLoader:
    """Entry point of the worker processes."""
    return InMemoryAgentLoader([limited_agent(os.environ[PROVIDER_URL_VARIABLE])])
