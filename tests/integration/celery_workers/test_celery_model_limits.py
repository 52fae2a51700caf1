"""Shared model limits across a Celery fleet: two worker processes, one provider limit, no turn failed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from agent_runner import AgentTurnStatus
from tests.helpers.fake_openai import FakeChatServer, ProviderLimit, RecordedRequest, Reply, completion
from tests.helpers.limited_agents import LIMIT_KEY, PROVIDER_URL_VARIABLE
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

TURNS = 30
PER_WINDOW = 10
LIMIT = ProviderLimit(requests=PER_WINDOW, window_s=2.0, concurrency=4)


@pytest.fixture
def provider() -> Iterator[FakeChatServer]:
    def answer(request: RecordedRequest) -> Reply:
        return Reply(body=completion("ok", usage=(20, 1)), delay=0.1)

    server = FakeChatServer(answer, LIMIT)
    yield server
    server.close()


def test_a_fleet_of_two_workers_keeps_to_one_shared_limit_and_fails_no_turn(
    make_cluster: Callable[..., Cluster], provider: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two worker processes sharing the provider's limit through Redis (the producer
    # here loads the same agents, so it needs the provider's address too)
    monkeypatch.setenv(PROVIDER_URL_VARIABLE, provider.base_url)
    cluster = make_cluster(
        AGENT_RUNNER_MODEL_LIMITS=json.dumps({LIMIT_KEY: {"rpm": 300, "concurrency": 4}}),
        AGENT_RUNNER_AGENT_LOADER="tests.helpers.limited_agents:build_loader",
        AGENT_RUNNER_RETRY_MAX_ATTEMPTS="1",  # any failed attempt would fail its turn
        **{PROVIDER_URL_VARIABLE: provider.base_url},
    )
    cluster.start_workers(2, concurrency=3)
    runner = cluster.runner
    # When 30 turns of two tenants start at once
    started = time.monotonic()
    ids = [runner.start("limited", f"question {n}", tenant_id=("acme", "globex")[n % 2]).id for n in range(TURNS)]
    cluster.wait_for(lambda: all(cluster.load(turn_id).is_terminal for turn_id in ids), 60, f"{TURNS} turns to end")
    drained = time.monotonic() - started
    # Then all completed, and the provider received at most 5% more requests than needed
    turns = [cluster.load(turn_id) for turn_id in ids]
    assert [t.status for t in turns] == [AgentTurnStatus.COMPLETED] * TURNS, [t.error for t in turns]
    assert provider.counts.accepted == TURNS
    assert provider.counts.accepted + provider.counts.refused <= TURNS * 1.05, provider.counts
    assert provider.counts.most_in_flight <= 4
    # And the turns waited for their slots: the drain takes at least what the limit allows
    assert drained >= (TURNS - PER_WINDOW) / PER_WINDOW * LIMIT.window_s * 0.9
    assert {t.tenant_id for t in turns} == {"acme", "globex"}
    assert any(t.attempt == 0 and t.steps >= 1 for t in turns)
