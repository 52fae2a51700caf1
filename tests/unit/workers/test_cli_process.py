"""The installed `agent-runner` script as a separate process: help, a command on a real database, exit statuses.

The other command line tests run it in this process; these check what only a real process
shows: the entry point of the package, the exit status the shell sees, and that errors reach
standard error as one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runner import Agent, AgentRunner, AiMessage, ScriptedChatModel
from store import SqlAgentTurnStore

SCRIPT = Path(sys.executable).with_name("agent-runner")


def agent_runner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELERY_BROKER_URL": ""}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'process.db'}"


def test_the_script_prints_its_help_and_lists_the_commands(tmp_path: Path) -> None:
    result = agent_runner("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("cancel", "db", "demo", "prune", "resume", "schedules", "serve", "turns", "worker"):
        assert f"\n  {command} " in result.stdout
    assert result.stderr == ""


def test_the_script_upgrades_and_reads_a_database(url: str, tmp_path: Path) -> None:
    upgraded = agent_runner("--database-url", url, "--json", "db", "upgrade", cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    assert json.loads(upgraded.stdout)["upgraded"] is True
    with SqlAgentTurnStore(url) as turn_store:
        agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hello")]))
        turn = AgentRunner(turn_store=turn_store).run(agent, "hi")
    listed = agent_runner("--database-url", url, "--json", "turns", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [(item["id"], item["status"]) for item in json.loads(listed.stdout)] == [(turn.id, "COMPLETED")]


def test_the_script_exits_2_for_bad_input_and_1_for_a_failing_database(url: str, tmp_path: Path) -> None:
    assert agent_runner("--database-url", url, "db", "upgrade", cwd=tmp_path).returncode == 0
    unknown = agent_runner("--database-url", url, "cancel", "no-such-turn", cwd=tmp_path)
    assert unknown.returncode == 2
    [line] = unknown.stderr.splitlines()
    assert line.startswith("error: ") and "no-such-turn" in line
    unreachable = agent_runner(
        "--database-url", "postgresql+psycopg://u:secret@127.0.0.1:1/x", "turns", "list", cwd=tmp_path
    )
    assert unreachable.returncode == 1
    [line] = unreachable.stderr.splitlines()
    assert line.startswith("error: ") and "secret" not in line and "Traceback" not in unreachable.stderr
