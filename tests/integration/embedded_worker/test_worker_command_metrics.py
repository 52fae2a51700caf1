"""`agent-runner worker` is instrumented like `serve` and the Celery workers: its metrics port serves step counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurnStatus
from store import SqlAgentTurnStore
from tests.helpers.api_server import free_port
from tests.helpers.metrics import scrape
from tests.integration.embedded_worker.embedded_fleet import loader, spawn_command_worker, wait_for

pytestmark = pytest.mark.integration


def test_the_metrics_port_of_the_worker_command_counts_the_steps_it_ran(sqlite_url: str, tmp_path: Path) -> None:
    port = free_port()
    with SqlAgentTurnStore(sqlite_url) as turns:
        # Given a worker command with AGENT_RUNNER_METRICS_PORT set, and a turn of two tool calls
        turn = AgentRunner(turn_store=turns, agent_loader=loader()).start("looper", "go")
        env = {"AGENT_RUNNER_METRICS_PORT": str(port), "AGENT_RUNNER_METRICS_ADDR": "127.0.0.1"}
        worker = spawn_command_worker(tmp_path, "metrics", sqlite_url, env)
        try:
            worker.wait_ready()
            assert f"metrics on http://127.0.0.1:{port}/metrics" in worker.log()
            # When it has run the turn to its end
            wait_for(lambda: turns.load(turn.id).is_terminal or None, 30, "the worker to finish the turn")
            assert turns.load(turn.id).status is AgentTurnStatus.COMPLETED
            samples = scrape(port)
        finally:
            code = worker.stop()
    # Then its /metrics counts the model and tool steps of the turn, and the turn's end
    steps = {labels: value for (name, labels), value in samples.items() if name == "agent_runner_steps_total"}
    assert steps[(("agent_id", "looper"), ("kind", "model"))] == 3
    assert steps[(("agent_id", "looper"), ("kind", "tool"))] == 2
    assert samples[("agent_runner_turns_ended_total", (("status", "COMPLETED"),))] == 1
    assert code == 0, worker.log()
