"""Scheduled turns in `agent-runner serve` with its embedded worker (SQLite, no beat): one turn per tick."""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agent_runner import AgentTurn, AgentTurnStatus
from store import SqlAgentTurnStore
from tests.helpers.api_server import AGENT_RUNNER, server_env
from tests.helpers.processes import REPO_ROOT
from tests.integration.api.api_server import AGENTS, eventually, serve
from workers.schedules import Schedule

pytestmark = pytest.mark.integration

INTERVAL_S = 2
SCHEDULE = Schedule("every-two-seconds", "desk", "tick", every=INTERVAL_S)
TICKS = 3


def _scheduled(turns: SqlAgentTurnStore) -> list[AgentTurn]:
    return [t for t in turns.list_turns(limit=1000) if t.metadata.get("schedule") == SCHEDULE.name]


def test_the_embedded_server_starts_one_turn_per_tick(tmp_path: Path) -> None:
    # Given a schedule every 2 s, and a server with its embedded worker on SQLite
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([SCHEDULE.to_dict()]))
    url = f"sqlite:///{tmp_path / 'api.db'}"
    with SqlAgentTurnStore(url) as turns:
        with contextmanager(serve)(tmp_path, url, AGENT_RUNNER_SCHEDULES=str(schedules)) as server:
            # When it runs for a few ticks
            eventually(
                lambda: sum(t.status is AgentTurnStatus.COMPLETED for t in _scheduled(turns)) >= TICKS,
                timeout=INTERVAL_S * TICKS + 20,
                what=f"{TICKS} scheduled turns to complete",
            )
            log = server.output()
        scheduled = _scheduled(turns)
    # And its log shows the scheduler's INFO lines, not only warnings
    assert f"schedule {SCHEDULE.name}: tick" in log, log

    # Then each tick started one turn, named by its tick, which the embedded worker ran
    # (a tick the server was too busy to reach in time is skipped, as beat skips it, never doubled)
    ticks = sorted(datetime.fromisoformat(t.metadata["scheduled_for"]) for t in scheduled)
    assert len(set(ticks)) == len(ticks), ticks
    assert all((tick - ticks[0]) % timedelta(seconds=INTERVAL_S) == timedelta(0) for tick in ticks), ticks
    for turn in scheduled:
        assert turn.id == SCHEDULE.turn_id(datetime.fromisoformat(turn.metadata["scheduled_for"]))
        if turn.status is AgentTurnStatus.COMPLETED:
            assert turn.final_output == "echo: tick"


def test_the_server_refuses_to_start_with_schedules_it_cannot_load(tmp_path: Path) -> None:
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([{"name": "bad", "agent_id": "desk", "input": "x", "every": "soon"}]))
    url = f"sqlite:///{tmp_path / 'api.db'}"
    refused = subprocess.run(
        [AGENT_RUNNER, "serve", "--agents", AGENTS, "--port", "0"],
        cwd=REPO_ROOT,
        env=server_env(url, AGENT_RUNNER_SCHEDULES=str(schedules)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("error: AGENT_RUNNER_SCHEDULES=")
    assert "every='soon' is not a duration" in refused.stderr and "Traceback" not in refused.stderr
