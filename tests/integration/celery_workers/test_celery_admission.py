"""Fair admission of new turns on a fleet of two real workers: a tenant's flood does not hold back another tenant.

A heavy tenant starts a crowd of turns, then a light tenant starts a few, before any worker
runs. Without admission the queue of new turns is first in, first out: the light tenant's
turns start after the whole crowd. With admission they start within the window (and the
turns the two tenants interleave) of the heavy tenant's. Every turn completes either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from redis import Redis

from agent_runner import AgentTurnStatus
from store.keys import RedisKeys
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

HEAVY = 200
LIGHT = 5
WINDOW = 4


def _start_order(cluster: Cluster) -> list[str]:
    """Turn ids in the order workers took their first step (their first TURN_RUNNING in the event log)."""
    events = sa.table("agent_turn_events", sa.column("id"), sa.column("turn_id"), sa.column("type"))
    query = (
        sa.select(events.c.turn_id, sa.func.min(events.c.id).label("first"))
        .where(events.c.type == "TURN_RUNNING")
        .group_by(events.c.turn_id)
        .order_by("first")
    )
    with cluster.turn_store.engine.connect() as connection:
        return [str(turn_id) for turn_id, _ in connection.execute(query)]


def _heavy_turns_before_the_light_ones(make_cluster: Callable[..., Cluster], **settings: str) -> int:
    """Run the flood; return how many heavy turns started after the light tenant's came and before its last started."""
    cluster = make_cluster(**settings)
    cluster.start_workers(2, concurrency=2, pool="threads")
    plain = json.dumps({"kind": "plain", "label": "flood"})
    # Warm up: a worker builds its connections on its first task, which would hold back
    # whichever turn it took first by half a second.
    warm = [cluster.runner.start("worker-agent", plain).id for _ in range(20)]
    _wait_completed(cluster, warm)
    heavy = [cluster.runner.start("worker-agent", _work(f"h{i}"), tenant_id="heavy").id for i in range(HEAVY)]
    started_before = set(_start_order(cluster))
    light = [cluster.runner.start("worker-agent", _work(f"l{i}"), tenant_id="light").id for i in range(LIGHT)]
    _wait_completed(cluster, [*heavy, *light])
    order = [turn_id for turn_id in _start_order(cluster) if turn_id not in started_before]
    last_light = max(order.index(turn_id) for turn_id in light)
    return len(set(order[:last_light]) & set(heavy))


def _work(label: str) -> str:
    """A turn of three short tool calls (about 60 ms): the flood is started faster than four slots drain it."""
    return json.dumps({"kind": "slow", "label": label, "seconds": 0.02})


def _wait_completed(cluster: Cluster, turn_ids: list[str]) -> None:
    cluster.wait_for(
        lambda: all(cluster.load(turn_id).status is AgentTurnStatus.COMPLETED for turn_id in turn_ids),
        45,
        "every turn to complete",
    )


def test_a_light_tenant_starts_within_the_window_of_a_heavy_tenants_flood(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given admission with a window of 4, and a heavy tenant that started 200 turns at once
    # When a light tenant starts 5 while the two workers work through them
    went_first = _heavy_turns_before_the_light_ones(make_cluster, AGENT_RUNNER_ADMISSION_WINDOW=str(WINDOW))
    # Then the light tenant's 5 turns started after at most the window's worth of heavy turns
    # plus one heavy turn for each light one (equal shares alternate) and one more per worker
    # slot that may have been handed out concurrently
    assert went_first <= WINDOW + LIGHT + 4, f"{went_first} heavy turns started before the light tenant's last"


def test_without_admission_a_light_tenant_waits_behind_the_whole_flood(make_cluster: Callable[..., Cluster]) -> None:
    # Given no admission: the queue of new turns is first in, first out
    went_first = _heavy_turns_before_the_light_ones(make_cluster)
    # Then the rest of the flood started before the light tenant's last turn (the test makes the
    # flood faster than the workers drain it: at least half of it is still queued)
    assert went_first >= HEAVY // 2, f"only {went_first} heavy turns started before the light tenant's last"


def test_turns_whose_lines_redis_lost_are_lined_up_again_and_complete(make_cluster: Callable[..., Cluster]) -> None:
    # Given admission with a window of 2, 30 new turns lined up, and no worker yet
    cluster = make_cluster(AGENT_RUNNER_ADMISSION_WINDOW="2")
    turns = [cluster.runner.start("worker-agent", _work(f"t{i}"), tenant_id="acme").id for i in range(30)]
    # When Redis loses the lines (a restart without persistence)
    client: Redis[Any] = Redis.from_url(cluster.redis_url)
    try:
        base = RedisKeys(cluster.settings.redis_prefix).admission(cluster.settings.queue)[0]
        lost = list(client.scan_iter(match=f"{base}*", count=1000))
        assert lost, "the admission keeps its lines in Redis"
        client.delete(*lost)
    finally:
        client.close()
    # And the workers and beat start
    cluster.start_workers(2, concurrency=2, pool="threads")
    cluster.start_beat()
    # Then the stale-turn sweep lines the forgotten turns up again, and every turn completes
    _wait_completed(cluster, turns)


def test_a_tenant_at_its_cap_runs_one_turn_at_a_time_while_another_tenant_runs_beside_it(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given admission with a cap of one active turn per tenant, and two workers running
    cluster = make_cluster(AGENT_RUNNER_ADMISSION_WINDOW="4", AGENT_RUNNER_TENANT_MAX_IN_FLIGHT="1")
    cluster.start_workers(2, concurrency=2, pool="threads")
    # When acme starts 4 turns at once, and globex 2
    acme = [cluster.runner.start("worker-agent", _work(f"a{i}"), tenant_id="acme").id for i in range(4)]
    globex = [cluster.runner.start("worker-agent", _work(f"g{i}"), tenant_id="globex").id for i in range(2)]
    _wait_completed(cluster, [*acme, *globex])
    # Then each acme turn started after the one before it ended
    spans = _spans(cluster)
    ordered = sorted(acme, key=lambda turn_id: spans[turn_id][0])
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert spans[after][0] > spans[before][1], f"{after} started before {before} ended"
    # And globex's first turn did not wait for acme's to end
    assert spans[globex[0]][0] < spans[ordered[0]][1]


def _spans(cluster: Cluster) -> dict[str, tuple[int, int]]:
    """Per turn, the log positions of its first TURN_RUNNING and of its TURN_COMPLETED."""
    events = sa.table("agent_turn_events", sa.column("id"), sa.column("turn_id"), sa.column("type"))
    query = sa.select(events.c.turn_id, events.c.type, events.c.id).where(
        events.c.type.in_(["TURN_RUNNING", "TURN_COMPLETED"])
    )
    first: dict[str, int] = {}
    ended: dict[str, int] = {}
    with cluster.turn_store.engine.connect() as connection:
        for turn_id, kind, position in connection.execute(query):
            if kind == "TURN_RUNNING":
                first[str(turn_id)] = min(first.get(str(turn_id), position), position)
            else:
                ended[str(turn_id)] = position
    return {turn_id: (first[turn_id], ended[turn_id]) for turn_id in ended}
