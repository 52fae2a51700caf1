"""Shared model limits in the embedded deployment: many turns at once against a small provider limit, and a fallback pair."""

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
from tests.helpers.limited_agents import LIMIT_KEY, limited_agent
from workers.database import Database, open_database
from workers.embedded import Stepping, build_embedded
from workers.settings import WorkerSettings

TURNS = 24
PER_WINDOW = 10
LIMIT = ProviderLimit(requests=PER_WINDOW, window_s=2.0)
PAIR_TURNS = 16
PRIMARY_LIMIT = ProviderLimit(requests=2, window_s=2.0)


@pytest.fixture
def provider() -> Iterator[FakeChatServer]:
    def answer(request: RecordedRequest) -> Reply:
        return Reply(body=completion("ok", usage=(20, 1)), delay=0.05)

    server = FakeChatServer(answer, LIMIT)
    yield server
    server.close()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = open_database(f"sqlite:///{tmp_path / 'limits.db'}")
    yield opened
    opened.close()


def test_turns_started_at_once_wait_for_capacity_and_none_fails(provider: FakeChatServer, database: Database) -> None:
    # Given an embedded deployment told the provider's limit (10 requests per 2 s = 300 a minute)
    settings = WorkerSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": str(database.engine.url),
            "AGENT_RUNNER_MODEL_LIMITS": json.dumps({LIMIT_KEY: {"rpm": 300}}),
            "AGENT_RUNNER_RETRY_MAX_ATTEMPTS": "1",  # any failed attempt would fail its turn
        }
    )
    agent = limited_agent(provider.base_url)
    deployment = build_embedded(settings, database, InMemoryAgentLoader([agent]), Stepping(4, poll_interval=0.05))
    runner = deployment.runner
    deployment.start()
    try:
        # When 24 turns of two tenants start at the same moment
        started = time.monotonic()
        turns = [runner.start(agent, f"question {n}", tenant_id=("acme", "globex")[n % 2]) for n in range(TURNS)]
        ids = [turn.id for turn in turns]
        deadline = started + 30
        while not all(runner.turn_store.load(turn_id).is_terminal for turn_id in ids):
            assert time.monotonic() < deadline, f"turns still open; provider saw {provider.counts}"
            time.sleep(0.1)
        drained = time.monotonic() - started
    finally:
        deployment.stop()
    # Then every turn completed, the provider refused (almost) nothing, and the turns waited
    # for their slots instead: the drain takes at least what the limit allows
    finished = [runner.turn_store.load(turn_id) for turn_id in ids]
    assert [t.status for t in finished] == [AgentTurnStatus.COMPLETED] * TURNS
    assert provider.counts.accepted == TURNS
    assert provider.counts.accepted + provider.counts.refused <= TURNS * 1.05
    assert drained >= (TURNS - PER_WINDOW) / PER_WINDOW * LIMIT.window_s * 0.9
    assert {t.tenant_id for t in finished} == {"acme", "globex"}


def test_a_tenant_arriving_behind_another_tenants_crowd_is_not_queued_behind_it(
    provider: FakeChatServer, database: Database
) -> None:
    # Given the same limit, and 20 turns of one tenant already queued for it
    settings = WorkerSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": str(database.engine.url),
            "AGENT_RUNNER_MODEL_LIMITS": json.dumps({LIMIT_KEY: {"rpm": 300}}),
        }
    )
    agent = limited_agent(provider.base_url)
    deployment = build_embedded(settings, database, InMemoryAgentLoader([agent]), Stepping(4, poll_interval=0.05))
    runner = deployment.runner
    deployment.start()
    try:
        crowd = [runner.start(agent, f"question {n}", tenant_id="crowd").id for n in range(20)]
        time.sleep(0.5)
        # When another tenant starts 4 turns
        newcomer = [runner.start(agent, f"question {n}", tenant_id="newcomer").id for n in range(4)]
        ids = crowd + newcomer
        deadline = time.monotonic() + 30
        while not all(runner.turn_store.load(turn_id).is_terminal for turn_id in ids):
            assert time.monotonic() < deadline, f"turns still open; provider saw {provider.counts}"
            time.sleep(0.1)
    finally:
        deployment.stop()
    # Then the newcomer shared the slots instead of waiting for the whole crowd: its turns
    # were done well before the crowd's last ones
    ended = {turn_id: runner.turn_store.load(turn_id).updated_at for turn_id in ids}
    assert all(runner.turn_store.load(turn_id).status is AgentTurnStatus.COMPLETED for turn_id in ids)
    crowd_last = sorted(ended[turn_id] for turn_id in crowd)
    assert max(ended[turn_id] for turn_id in newcomer) < crowd_last[-4]
    assert provider.counts.refused <= 1


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
        ids = [runner.start(agent, f"question {n}").id for n in range(PAIR_TURNS)]
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
    assert [t.status for t in finished] == [AgentTurnStatus.COMPLETED] * PAIR_TURNS
    assert primary_server.counts.refused == 0
    assert 1 <= primary_server.counts.accepted <= 3
    assert primary_server.counts.accepted + len(secondary_server.requests) == PAIR_TURNS
    assert drained < 10
