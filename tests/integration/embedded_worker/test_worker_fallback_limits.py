"""A fallback pair in the embedded deployment: each provider's shared limit counts the calls made to it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_runner import Agent, AgentTurnStatus, InMemoryAgentLoader
from agent_runner.models import FallbackChatModel
from agent_runner.models.openai import OpenAIChatModel
from tests.helpers.fake_openai import FakeChatServer, ProviderLimit, RecordedRequest, Reply, completion
from workers.database import Database, open_database
from workers.embedded import Stepping, build_embedded
from workers.settings import WorkerSettings

TURNS = 16
PRIMARY_LIMIT = ProviderLimit(requests=2, window_s=2.0)


def _answer(text: str) -> Callable[[RecordedRequest], Reply]:
    def answer(request: RecordedRequest) -> Reply:
        return Reply(body=completion(text, usage=(20, 1)), delay=0.02)

    return answer


@pytest.fixture
def providers() -> Iterator[tuple[FakeChatServer, FakeChatServer]]:
    primary = FakeChatServer(_answer("from primary"), PRIMARY_LIMIT)
    secondary = FakeChatServer(_answer("from secondary"))
    yield primary, secondary
    primary.close()
    secondary.close()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = open_database(f"sqlite:///{tmp_path / 'fallback.db'}")
    yield opened
    opened.close()


def test_a_crowd_beyond_the_primarys_limit_goes_to_the_secondary_and_neither_provider_refuses(
    providers: tuple[FakeChatServer, FakeChatServer], database: Database
) -> None:
    # Given a primary provider allowing 2 requests per 2 s (60 a minute) and a secondary,
    # each model counted against its own key
    primary_server, secondary_server = providers
    settings = WorkerSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": str(database.engine.url),
            "AGENT_RUNNER_MODEL_LIMITS": json.dumps({"openai:primary": {"rpm": 60}, "openai:secondary": {"rpm": 6000}}),
            "AGENT_RUNNER_RETRY_MAX_ATTEMPTS": "1",  # any failed attempt would fail its turn
        }
    )
    models = [
        OpenAIChatModel(name, base_url=server.base_url, api_key="k", timeout=10.0, max_tokens=16)
        for name, server in (("primary", primary_server), ("secondary", secondary_server))
    ]
    agent = Agent(id="pair", instructions="Answer in one word.", chat_model=FallbackChatModel(models))
    deployment = build_embedded(settings, database, InMemoryAgentLoader([agent]), Stepping(4, poll_interval=0.05))
    runner = deployment.runner
    deployment.start()
    try:
        # When 16 turns start at the same moment
        started = time.monotonic()
        ids = [runner.start(agent, f"question {n}").id for n in range(TURNS)]
        while not all(runner.turn_store.load(turn_id).is_terminal for turn_id in ids):
            assert time.monotonic() < started + 30, f"turns still open: {primary_server.counts}"
            time.sleep(0.05)
        drained = time.monotonic() - started
    finally:
        deployment.stop()
        for model in models:
            model.close()
    # Then every turn completed at once rather than waiting minutes for the primary's slots:
    # the primary took what its limit allows and the secondary the rest, and no provider refused
    finished = [runner.turn_store.load(turn_id) for turn_id in ids]
    assert [t.status for t in finished] == [AgentTurnStatus.COMPLETED] * TURNS
    assert primary_server.counts.refused == 0
    assert 1 <= primary_server.counts.accepted <= 3
    assert primary_server.counts.accepted + len(secondary_server.requests) == TURNS
    assert drained < 10
