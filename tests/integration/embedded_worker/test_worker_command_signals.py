"""`agent-runner worker` under a process manager: SIGTERM stops it as gracefully as Ctrl-C."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurnStatus
from store import SqlAgentTurnStore
from tests.integration.embedded_worker.embedded_fleet import loader, spawn_command_worker, wait_for

pytestmark = pytest.mark.integration


def test_sigterm_lets_the_steps_in_flight_finish_and_exits_cleanly(sqlite_url: str, tmp_path: Path) -> None:
    with SqlAgentTurnStore(sqlite_url) as turns:
        # Given a worker stepping a turn whose tool calls take a while
        turn = AgentRunner(turn_store=turns, agent_loader=loader()).start("pauser", "go slowly")
        worker = spawn_command_worker(tmp_path, "sigterm", sqlite_url)
        try:
            worker.wait_ready()
            wait_for(lambda: turns.load(turn.id).version >= 2 or None, 30, "the worker to step the turn")
        finally:
            # When the process manager sends SIGTERM (docker stop, systemd)
            code = worker.stop(signum=signal.SIGTERM)
        stopped = turns.load(turn.id)

    # Then the command exits 0 after its threads stopped, instead of dying on the signal
    assert code == 0, worker.log()
    # And what it left is a consistent snapshot another worker takes up: running or done, never failed
    assert stopped.status in (AgentTurnStatus.RUNNING, AgentTurnStatus.COMPLETED), stopped.status
