"""Approval deadlines without beat: the embedded worker reminds, then applies the default, in process and in `agent-runner worker`."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_runner import (
    ActionStatus,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
)
from agent_runner.persistence import EventScope
from agent_runner.worker import AgentWorker
from store import SqlAgentTurnStore, SqlChatMemoryProvider, SqlTurnLease
from tests.helpers import deadline_agents
from tests.helpers.api_server import AGENT_RUNNER, server_env
from tests.helpers.deadline_agents import APPROVAL_TIMEOUT_S, SWEEP_ENV, build_loader, deadline_problems
from tests.helpers.processes import REPO_ROOT

pytestmark = pytest.mark.integration

AGENTS = f"{deadline_agents.__name__}:build_loader"
WAIT_S = APPROVAL_TIMEOUT_S + 30


def _ended(turns: SqlAgentTurnStore, turn_id: str, alive: Callable[[], str | None] = lambda: None) -> AgentTurn:
    """Wait until the turn ends; `alive` returns why waiting is pointless (a process died), if it is."""
    deadline = time.monotonic() + WAIT_S
    while not (turn := turns.load(turn_id)).is_terminal:
        problem = alive()
        assert problem is None, problem
        assert time.monotonic() < deadline, f"turn {turn_id} did not end within {WAIT_S}s: {turn.status}"
        time.sleep(0.05)
    return turn


def test_an_in_process_worker_reminds_then_approves_by_default_at_the_deadline(sqlite_url: str) -> None:
    # Given an embedded worker on SQLite that sweeps deadlines five times a second, and no beat
    with SqlAgentTurnStore(sqlite_url) as turns:
        runner = AgentRunner(
            turn_store=turns,
            agent_loader=build_loader(),
            chat_memory_provider=SqlChatMemoryProvider(turns.engine),
            policy=AgentExecutionPolicy(deadline_reminder=0.5),
        )
        worker = AgentWorker(runner, lease=SqlTurnLease(turns.engine), poll_interval=0.05, deadline_interval=0.2)
        with worker:
            # When a turn waits for an approval nobody gives
            turn = runner.start("ops", "restart api", conversation_id="conv-restart")
            ended = _ended(turns, turn.id)
        events = turns.read_events(EventScope.tree(turn.id), limit=1000)

    # Then the reminder came halfway, the default approved the call at the deadline, and the turn went on
    assert deadline_problems(events, "call-restart") == []
    assert (ended.status, ended.final_output) == (AgentTurnStatus.COMPLETED, "done: restarted api")
    (action,) = ended.page_actions
    assert action.status is ActionStatus.APPROVED
    assert (action.decision["decided_by"], action.decision["reason"]) == ("system", "deadline passed")


def test_the_agent_runner_worker_command_applies_deadlines_with_the_sweep_settings(
    sqlite_url: str, tmp_path: Path
) -> None:
    # Given a turn waiting for an approval that is rejected by default
    with SqlAgentTurnStore(sqlite_url) as turns:
        turn = AgentRunner(turn_store=turns, agent_loader=build_loader()).start("ops", "deploy api")
        # And `agent-runner worker`, the only process that runs, with the sweep settings of the deployment
        log = tmp_path / "worker.log"
        command = [AGENT_RUNNER, "--database-url", sqlite_url, "--agents", AGENTS, "worker", "--poll-interval", "0.05"]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*command, "--run-for", str(WAIT_S + 30)],
                cwd=REPO_ROOT,
                env=server_env(sqlite_url, **SWEEP_ENV),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            # When nobody decides
            ended = _ended(
                turns,
                turn.id,
                lambda: None if process.poll() is None else f"the worker exited:\n{log.read_text(errors='replace')}",
            )
        finally:
            process.send_signal(signal.SIGINT)  # the command stops its worker on Ctrl-C
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        events = turns.read_events(EventScope.tree(turn.id), limit=1000)

    # Then the worker reminded once, rejected the call at its deadline, and the model answered
    assert deadline_problems(events, "call-deploy") == []
    assert ended.status is AgentTurnStatus.COMPLETED
    assert ended.final_output is not None and ended.final_output.startswith("not done: ")
    assert ended.page_actions[0].status is ActionStatus.REJECTED
    assert process.returncode == 0, log.read_text(errors="replace")
