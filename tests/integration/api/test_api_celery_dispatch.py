"""`agent-runner serve --worker celery` answers before its step messages leave: none is lost when it stops or dies."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from agent_runner import AgentTurnStatus
from tests.conftest import TEST_REDIS_URL
from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import AGENTS
from tests.integration.celery_workers.celery_cluster import Cluster, clusters
from workers.sweeps import sweep_stale_turns

pytestmark = pytest.mark.integration

CLIENTS = 4
PER_CLIENT = 20
DEAD_BROKER = "redis://127.0.0.1:1/0"
"""Nothing listens there: every publish fails."""


def _start_turns(server: ApiServer) -> list[str]:
    """Start `CLIENTS * PER_CLIENT` turns from `CLIENTS` threads; the ids of the answered turns."""
    ids: list[str] = []
    failures: list[str] = []

    def client() -> None:
        with server.client() as http:
            for n in range(PER_CLIENT):
                response = http.post("/v1/turns", json={"agent_id": "desk", "input": f"hello {n}"})
                if response.status_code == 201:
                    ids.append(response.json()["id"])
                else:
                    failures.append(response.text)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    return ids


def _server(cluster: Cluster, tmp_path: Path, name: str, **env: str) -> ApiServer:
    return ApiServer(agents=AGENTS, env={**cluster.env, **env}, log=tmp_path / f"{name}.log")


def _answered_then_signalled(server: ApiServer, sig: signal.Signals) -> list[str]:
    """Start the server, start turns through it from several clients, then send it `sig` and wait for its end."""
    server.start()
    try:
        ids = _start_turns(server)
        process = server.process
        assert process is not None
        process.send_signal(sig)
        process.wait(30)
    finally:
        server.stop()
    return ids


def test_a_server_stopped_right_after_answering_has_sent_each_first_step_once(pg_url: str, tmp_path: Path) -> None:
    with clusters(pg_url, TEST_REDIS_URL, tmp_path) as make:
        cluster = make(AGENT_RUNNER_AGENT_LOADER=AGENTS)
        # Given turns started from several clients
        # When the server gets SIGTERM as soon as the last answer came
        ids = _answered_then_signalled(_server(cluster, tmp_path, "server"), signal.SIGTERM)
        # Then the queue holds each turn's first step, once
        assert len(ids) == CLIENTS * PER_CLIENT
        assert cluster.queued_steps() == Counter({(turn_id, 0): 1 for turn_id in ids})


def test_turns_answered_by_a_server_that_died_before_sending_run_after_the_stale_turn_sweep(
    pg_url: str, tmp_path: Path
) -> None:
    with clusters(pg_url, TEST_REDIS_URL, tmp_path) as make:
        cluster = make(AGENT_RUNNER_AGENT_LOADER=AGENTS)
        # Given turns answered by a server whose step messages could not leave (its broker
        # does not answer), which then dies
        ids = _answered_then_signalled(
            _server(cluster, tmp_path, "server", CELERY_BROKER_URL=DEAD_BROKER), signal.SIGKILL
        )
        assert cluster.queued_steps() == Counter()
        assert {cluster.load(turn_id).status for turn_id in ids} == {AgentTurnStatus.READY}

        # When a worker runs and the stale-turn sweep has found them (READY for a lease TTL)
        cluster.start_worker("w1")
        cluster.wait_for(lambda: sweep_stale_turns(cluster.wiring) > 0, 15, "the sweep to re-send the turns")

        def sweep() -> None:  # turns answered later become stale later
            sweep_stale_turns(cluster.wiring)

        # Then every one of them runs to its end
        cluster.wait_for(
            lambda: all(cluster.load(turn_id).status is AgentTurnStatus.COMPLETED for turn_id in ids),
            60,
            "every turn to complete",
            tick=sweep,
        )
