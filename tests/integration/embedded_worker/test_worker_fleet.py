"""Two `AgentWorker` processes on one database work through 100 turns, never stepping one turn twice at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurnStatus, ToolMessage
from store import SqlAgentTurnStore
from tests.helpers.jsonl import read_jsonl
from tests.integration.embedded_worker.embedded_fleet import (
    LOOPER_STEPS,
    WorkerProcess,
    history_problems,
    loader,
    overlapping_steps,
    spawn_worker,
    wait_for,
)

pytestmark = pytest.mark.integration

TURNS = 100
ACTIVE = [s for s in AgentTurnStatus if not s.is_terminal]


@pytest.mark.parametrize(
    "database",
    [
        "sqlite",
        "postgres",
    ],
)
def test_two_worker_processes_complete_100_turns_without_stepping_a_turn_twice_at_once(
    database: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = str(request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url"))
    step_log = tmp_path / "steps"
    processes: list[WorkerProcess] = []
    with SqlAgentTurnStore(url) as turns:
        runner = AgentRunner(turn_store=turns, agent_loader=loader())
        turns.list_runnable(runner.clock(), 1)  # create the SQLite file before the workers open it
        try:
            # Given two worker processes with two threads each, sharing the SQL lease
            for name in ("a", "b"):
                processes.append(spawn_worker(tmp_path, name, url, concurrency=2, step_log=step_log))
            for process in processes:
                process.wait_ready()
            # When 100 turns are started while both poll (each calls a tool twice, then answers)
            ids = [runner.start("looper", f"job {n}").id for n in range(TURNS)]
            logs = "\n".join(p.log() for p in processes)
            wait_for(
                lambda: not turns.list_turns(statuses=ACTIVE, limit=1),
                60,
                f"every turn to end; worker logs:\n{logs}",
            )
            exit_codes = [process.stop() for process in processes]
        finally:
            for process in processes:
                process.stop()
        # Then every turn completed with its two tool results, each once
        for turn_id in ids:
            done = turns.load(turn_id)
            assert done.status is AgentTurnStatus.COMPLETED, done
            assert [m.content for m in done.messages if isinstance(m, ToolMessage)] == ["fast 0", "fast 1"]
            assert history_problems(done) == []
    logs = "\n".join(p.log() for p in processes)
    assert exit_codes == [0, 0], logs
    assert "ERROR" not in logs and "Traceback" not in logs, logs
    # And no step of a turn overlapped another step of the same turn, across both processes
    steps = read_jsonl(*step_log.glob("steps-*.jsonl"))
    assert overlapping_steps(steps) == []
    # And no step was repeated: each turn took exactly its five steps
    per_turn: dict[str, int] = {}
    for record in steps:
        per_turn[record["turn"]] = per_turn.get(record["turn"], 0) + 1
    assert per_turn == dict.fromkeys(ids, LOOPER_STEPS)
    # And both processes did part of the work
    assert {record["pid"] for record in steps} == {p.pid for p in processes}
