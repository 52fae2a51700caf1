"""A stale worker woken after losing its lease cannot save: the fence refuses it, on every real backend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from agent_runner import AgentRunner, AgentTurnStatus, LeaseLostError, TurnLease, VersionConflictError
from agent_runner.worker import AgentWorker
from store import SqlAgentTurnStore, SqlTurnLease
from tests.integration.embedded_worker.embedded_fleet import history_problems, loader

pytestmark = pytest.mark.integration

STALE_TTL_MS = 400


@pytest.fixture(
    params=[
        "sqlite-with-sql-lease",
        "postgres-with-sql-lease",
        "postgres-with-redis-lease",
    ]
)
def backends(request: pytest.FixtureRequest) -> Iterator[tuple[SqlAgentTurnStore, TurnLease]]:
    database, lease_kind = request.param.split("-with-")
    url = str(request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url"))
    with ExitStack() as stack:
        turns = stack.enter_context(SqlAgentTurnStore(url))
        lease: TurnLease
        if lease_kind == "redis-lease":
            from store import RedisTurnLease

            redis_url = str(request.getfixturevalue("redis_url"))
            prefix = str(request.getfixturevalue("redis_prefix"))
            lease = stack.enter_context(RedisTurnLease(redis_url, prefix=prefix))
        else:
            lease = stack.enter_context(SqlTurnLease(turns.engine))
        yield turns, lease


def test_a_stale_holder_woken_after_losing_its_lease_cannot_save(
    backends: tuple[SqlAgentTurnStore, TurnLease],
) -> None:
    turns, lease = backends
    # Given a turn, and holder A that took its lease and saved one step under its fence
    stale_runner = AgentRunner(turn_store=turns, agent_loader=loader())
    turn = stale_runner.start("looper", "two lookups please")
    held_by_a = lease.acquire(turn.id, "worker-a", STALE_TTL_MS)
    assert held_by_a is not None
    after_a = stale_runner.step(turn.model_copy(update={"lease_fence": held_by_a.fence})).turn
    assert (after_a.status, after_a.lease_fence) == (AgentTurnStatus.RUNNING, held_by_a.fence)
    # When A pauses past its TTL without renewing (a long GC pause, a frozen VM)
    time.sleep(STALE_TTL_MS / 1000 + 0.3)
    # And worker B takes the turn over with a higher fence and saves a step
    runner_b = AgentRunner(turn_store=turns, agent_loader=loader())
    worker_b = AgentWorker(runner_b, lease=lease, lease_ttl=10, max_steps_per_claim=1, owner="worker-b")
    assert worker_b.run_once() == 1
    after_b = turns.load(turn.id)
    assert after_b.lease_fence is not None and after_b.lease_fence > held_by_a.fence
    assert after_b.version == after_a.version + 1
    # Then A, waking up, can neither renew nor release its lease
    assert lease.renew(held_by_a, STALE_TTL_MS) is False
    # And A continuing from its own snapshot is refused (the version moved on); nothing is written
    continued = stale_runner.step(after_a)
    assert isinstance(continued.error, VersionConflictError)
    assert turns.load(turn.id) == after_b
    # And even a save at the current version is refused because of A's older fence
    with pytest.raises(LeaseLostError):
        stale_runner.step(after_b.model_copy(update={"lease_fence": held_by_a.fence}))
    with pytest.raises(LeaseLostError):
        turns.save(after_b.model_copy(update={"lease_fence": held_by_a.fence, "error": "from A"}), after_b.version)
    # So the stored turn is still B's
    assert turns.load(turn.id) == after_b
    assert lease.release(held_by_a) is False
    # And B goes on to complete it
    while worker_b.run_once():
        pass
    done = turns.load(turn.id)
    assert done.status is AgentTurnStatus.COMPLETED
    assert done.lease_fence is not None and done.lease_fence > held_by_a.fence
    assert history_problems(done) == []
