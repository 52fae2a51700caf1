"""A worker process killed with SIGKILL in the middle of a slow tool: another worker completes the turn."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurnStatus, ToolMessage
from store import SqlAgentTurnStore
from tests.helpers.jsonl import read_jsonl
from tests.integration.embedded_worker.embedded_fleet import (
    WorkerProcess,
    history_problems,
    loader,
    spawn_worker,
    turn_with_status,
    wait_for,
)

pytestmark = pytest.mark.integration

LEASE_TTL_S = 1.5


@dataclass(frozen=True)
class Backend:
    database_url: str
    lease: str
    redis_url: str | None = None
    redis_prefix: str | None = None


@pytest.fixture(
    params=[
        "sqlite-with-sql-lease",
        "postgres-with-redis-lease",
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "sqlite-with-sql-lease":
        return Backend(str(request.getfixturevalue("sqlite_url")), "sql")
    return Backend(
        str(request.getfixturevalue("pg_url")),
        "redis",
        str(request.getfixturevalue("redis_url")),
        str(request.getfixturevalue("redis_prefix")),
    )


def test_a_worker_killed_mid_tool_is_replaced_after_the_lease_ttl_with_the_same_idempotency_key(
    backend: Backend, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    processes: list[WorkerProcess] = []
    with SqlAgentTurnStore(backend.database_url) as turns:
        runner = AgentRunner(turn_store=turns, agent_loader=loader())
        try:
            # Given two worker processes polling the same store, with a lease TTL of 1.5 s
            for name in ("a", "b"):
                processes.append(
                    spawn_worker(
                        tmp_path,
                        name,
                        backend.database_url,
                        lease=backend.lease,
                        redis_url=backend.redis_url,
                        redis_prefix=backend.redis_prefix,
                        lease_ttl=LEASE_TTL_S,
                        ledger=ledger,
                    )
                )
            for process in processes:
                process.wait_ready()
            # And a turn whose tool hangs on its first execution
            turn = runner.start("slow-once", "do the slow thing")
            first = wait_for(lambda: read_jsonl(ledger), 20, "the tool to start")[0]
            victim = next(p for p in processes if p.pid == first["pid"])
            survivor = next(p for p in processes if p is not victim)
            # While the tool runs, the heartbeat keeps the other worker out even past the TTL
            time.sleep(LEASE_TTL_S * 1.5)
            assert len(read_jsonl(ledger)) == 1, survivor.log()
            # When the worker running the tool is killed outright
            killed_at = time.time()
            victim.kill()
            # Then the other worker completes the turn once the dead worker's lease has expired
            done = wait_for(
                turn_with_status(turns, turn.id, AgentTurnStatus.COMPLETED),
                30,
                f"the turn to complete; survivor log:\n{survivor.log()}",
            )
            runs = read_jsonl(ledger)
            assert [r["pid"] for r in runs] == [victim.pid, survivor.pid]
            # The last renewal was at most a third of the TTL before the kill, so the lease
            # stayed valid for at least two thirds of the TTL after it.
            assert runs[1]["at"] >= killed_at + LEASE_TTL_S * 2 / 3 - 0.05
            # And the tool saw the same idempotency key both times
            assert runs[0]["key"] == runs[1]["key"]
            # And the history has every message once: nothing lost, nothing duplicated
            assert [m.role for m in done.messages] == ["user", "assistant", "tool", "assistant"]
            assert history_problems(done) == []
            results = [m for m in done.messages if isinstance(m, ToolMessage)]
            assert [m.content for m in results] == [f"done by {survivor.pid}"]
            assert done.steps == 3
            assert survivor.stop() == 0, survivor.log()
        finally:
            for process in processes:
                process.stop()
