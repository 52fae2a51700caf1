"""Scheduled turns without beat: two `agent-runner worker` processes on one PostgreSQL schema start one turn per tick."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agent_runner import AgentTurn, AgentTurnStatus
from store import SqlAgentTurnStore
from tests.integration.embedded_worker.embedded_fleet import CommandWorker, spawn_command_worker, wait_for
from workers.schedules import Schedule

pytestmark = pytest.mark.integration

INTERVAL_S = 2
SCHEDULE = Schedule("every-two-seconds", "looper", "tick", every=INTERVAL_S)
RUN_S = 7


def _scheduled(turns: SqlAgentTurnStore) -> list[AgentTurn]:
    return [t for t in turns.list_turns(limit=1000) if t.metadata.get("schedule") == SCHEDULE.name]


def test_two_workers_start_one_turn_per_tick(pg_url: str, tmp_path: Path) -> None:
    # Given a schedule every 2 s, and two `agent-runner worker` processes on the same database (no beat)
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([SCHEDULE.to_dict()]))
    env = {"AGENT_RUNNER_SCHEDULES": str(schedules)}
    workers: list[CommandWorker] = []
    with SqlAgentTurnStore(pg_url) as turns:
        try:
            workers = [spawn_command_worker(tmp_path, name, pg_url, env) for name in ("a", "b")]
            for worker in workers:
                worker.wait_ready()

            # When they run for a while
            time.sleep(RUN_S)
            wait_for(
                lambda: sum(t.status is AgentTurnStatus.COMPLETED for t in _scheduled(turns)) >= RUN_S // INTERVAL_S,
                30,
                "the scheduled turns to complete",
            )
        finally:
            codes = [worker.stop() for worker in workers]
        scheduled = _scheduled(turns)

    # Then every tick between the first and the last started exactly one turn, named by its tick
    ticks = sorted(datetime.fromisoformat(t.metadata["scheduled_for"]) for t in scheduled)
    assert len(ticks) == len(set(ticks)), f"a tick started several turns: {ticks}"
    assert ticks == [ticks[0] + timedelta(seconds=INTERVAL_S * i) for i in range(len(ticks))], ticks
    assert len(ticks) >= RUN_S // INTERVAL_S
    for turn in scheduled:
        assert turn.id == SCHEDULE.turn_id(datetime.fromisoformat(turn.metadata["scheduled_for"]))
        if turn.status is AgentTurnStatus.COMPLETED:
            assert turn.final_output == "finished after 2 tool calls"
    # And both processes fired the schedule, and stopped cleanly on Ctrl-C
    logs = [worker.log() for worker in workers]
    assert all(f"firing schedules {SCHEDULE.name}" in log for log in logs), logs
    assert codes == [0, 0], logs
    assert not any("Traceback" in log for log in logs), logs


def test_the_worker_command_shows_the_info_lines_of_its_scheduler(sqlite_url: str, tmp_path: Path) -> None:
    # Given a worker command firing a schedule, with no logging configured by anyone
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([SCHEDULE.to_dict()]))
    worker = spawn_command_worker(tmp_path, "logs", sqlite_url, {"AGENT_RUNNER_SCHEDULES": str(schedules)})
    try:
        worker.wait_ready()
        # When a tick fires, then its INFO line is in the output, not only warnings
        wait_for(lambda: f"schedule {SCHEDULE.name}: tick" in worker.log() or None, 20, "the tick's log line")
    finally:
        assert worker.stop() == 0, worker.log()
