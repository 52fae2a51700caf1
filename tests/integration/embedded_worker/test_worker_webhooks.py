"""`agent-runner worker` delivers webhooks on a thread of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurnStatus
from store import SqlAgentTurnStore
from tests.helpers.webhook_receiver import webhook_env, webhook_receiver
from tests.integration.embedded_worker.embedded_fleet import loader, spawn_command_worker, wait_for

pytestmark = pytest.mark.integration

SECRET = "whsec-worker-command"


def test_the_worker_command_sends_the_ended_webhook_of_the_turns_it_runs(sqlite_url: str, tmp_path: Path) -> None:
    with webhook_receiver() as receiver, SqlAgentTurnStore(sqlite_url) as turns:
        # Given: a worker with webhooks configured, and a turn for it
        turn = AgentRunner(turn_store=turns, agent_loader=loader()).start("looper", "go")
        worker = spawn_command_worker(tmp_path, "hooks", sqlite_url, webhook_env(receiver, SECRET))
        try:
            worker.wait_ready()
            wait_for(lambda: turns.load(turn.id).status is AgentTurnStatus.COMPLETED or None, 30, "the turn to end")
            # Then: the ended webhook arrives, signed
            receiver.wait_for(lambda: len(receiver.of_turn(turn.id)) == 1, "the ended webhook")
        finally:
            worker.stop()
        [received] = receiver.of_turn(turn.id)
        assert received.path == "/ended" and received.payload["event"]["type"] == "TURN_COMPLETED"
        assert received.signature_is_valid(SECRET)
