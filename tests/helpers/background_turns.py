"""A turn whose model answers in the background (`OpenAIResponsesModel(background=True)`), as each process builds it.

Celery workers load the agent with `LOADER`, the fake provider's URL in `URL_ENV`.

`python -m tests.helpers.background_turns <store url> <server url> <turn id>` picks the
waiting turn up in a fresh process, polls it until it settles (on the real clock) and
prints its final status and output.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AgentTurnStore,
    InMemoryAgentLoader,
    RetryPolicy,
    tool,
)
from agent_runner.models.openai import OpenAIResponsesModel

URL_ENV = "BACKGROUND_RESPONSES_URL"
LOADER = "tests.helpers.background_turns:build_loader"


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def forecaster(server_url: str) -> Agent:
    """The agent, on a background model at `server_url`."""
    model = OpenAIResponsesModel("o4-mini", api_key="k", base_url=server_url, background=True)
    return Agent(id="forecaster", chat_model=model, tools=[weather])


def build_loader() -> InMemoryAgentLoader:
    return InMemoryAgentLoader([forecaster(os.environ[URL_ENV])])


def runner_for(
    server_url: str, turns: AgentTurnStore, clock: Callable[[], datetime] | None = None, **options: Any
) -> tuple[AgentRunner, Agent]:
    """The runner (`options`: more of `AgentRunner`'s arguments) and its agent on a background model."""
    agent = forecaster(server_url)
    policy = AgentExecutionPolicy(retry=RetryPolicy(jitter=0))
    if clock is not None:
        options["clock"] = clock
    return AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([agent]), policy=policy, **options), agent


def settle(runner: AgentRunner, turn: AgentTurn, timeout: float = 30.0) -> AgentTurn:
    """Step the turn whenever its next poll (or retry) is due, on the real clock."""
    deadline = time.monotonic() + timeout
    while turn.status is AgentTurnStatus.RETRY_SCHEDULED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {turn.id} still waits after {timeout} s")
        if turn.next_retry_at is not None:
            time.sleep(max(0.0, (turn.next_retry_at - runner.clock()).total_seconds()))
        turn = runner.run_until_blocked(runner.restore(turn.id))
    return turn


def main(store_url: str, server_url: str, turn_id: str) -> None:
    import store

    with store.SqlAgentTurnStore(store_url) as turns:
        runner, _ = runner_for(server_url, turns)
        turn = settle(runner, runner.restore(turn_id))
        print(turn.status.value, turn.final_output)


if __name__ == "__main__":
    main(*sys.argv[1:4])
