"""Many turns across several worker processes: mixed scenarios, and a worker killed with SIGKILL mid-run."""

from __future__ import annotations

import time

import pytest

from store import InboxStatus
from tests.integration.celery_workers.celery_cluster import Cluster
from tests.integration.celery_workers.celery_workload import COMPLETED, Scenario, in_flight, run_workload, scenario

pytestmark = pytest.mark.integration


def test_mixed_turns_across_two_workers_reach_their_expected_status(cluster: Cluster) -> None:
    # Given two worker processes (two pool processes each) and 42 turns of every kind; no beat
    # runs, so everything must move on the fast paths alone
    cluster.start_worker("w1", wait=False)
    cluster.start_worker("w2", wait=False)
    for worker in cluster.processes:
        cluster.wait_ready(worker)

    # When they all run, with people answering approvals and forms as they come up
    # Then each ends in its expected status and made its side effects exactly once
    run_workload(cluster, [scenario(i) for i in range(42)], timeout=90)
    assert all(row["executions"] == 1 for row in cluster.ledger())


@pytest.mark.slow
def test_two_hundred_mixed_turns_across_two_workers_reach_their_expected_status(cluster: Cluster) -> None:
    cluster.start_worker("w1", wait=False)
    cluster.start_worker("w2", wait=False)
    for worker in cluster.processes:
        cluster.wait_ready(worker)
    started = time.monotonic()
    run_workload(cluster, [scenario(i) for i in range(200)], timeout=300)
    print(f"200 turns in {time.monotonic() - started:.1f}s")


def test_a_worker_killed_mid_run_loses_no_turn_and_repeats_no_side_effect(cluster: Cluster) -> None:
    # Given two workers, a beat, turns with slow tools, and conversations with queued messages
    w1 = cluster.start_worker("w1", wait=False)
    cluster.start_worker("w2", wait=False)
    for worker in cluster.processes:
        cluster.wait_ready(worker)
    cluster.start_beat()
    inbox = cluster.wiring.inbox
    messages = [(f"conv-{c}", f"m{c}-{n}") for c in range(4) for n in range(4)]
    for conversation_id, label in messages:
        inbox.enqueue(conversation_id, f"id-{label}", label)
    scenarios = [scenario(i, slow=True) for i in range(32)]
    scenarios += [
        Scenario({"kind": "slow", "label": f"s{i}", "seconds": 0.4}, COMPLETED, tuple(f"s{i}:s{j}" for j in range(3)))
        for i in range(8)
    ]
    in_flight_at_kill: list[set[str]] = []

    def kill_once_busy() -> None:
        # Kill w1 in the middle of work: once a few side effects are in and it runs a task.
        if in_flight_at_kill or len(cluster.ledger()) < 12:
            return
        running = in_flight(w1.output())
        if running:
            w1.kill()
            in_flight_at_kill.append(running)

    conversations = sorted({c for c, _ in messages})

    def inbox_done() -> bool:
        return all(
            inbox.get(f"id-{label}").status is InboxStatus.COMPLETED  # type: ignore[union-attr]
            for _, label in messages
        ) and all(cluster.turn_store.find_active_turn(c) is None for c in conversations)

    # When w1 and its pool processes are killed with SIGKILL mid-run
    # Then every turn still ends as expected, every queued message is processed, and no side
    # effect happened twice (a call re-run after the kill reused its idempotency key)
    inbox_effects = tuple(f"inbox:{label}" for _, label in messages)
    run_workload(
        cluster, scenarios, timeout=120, during=kill_once_busy, other_effects=inbox_effects, others_done=inbox_done
    )
    assert in_flight_at_kill, "the workload ended before w1 could be killed mid-task"

    # And every queued message started exactly one turn, in order, and each turn completed
    for conversation_id in conversations:
        turns = cluster.turn_store.list_turns(conversation_id=conversation_id)
        assert len(turns) == 4
        assert all(t.status is COMPLETED for t in turns)
    turn_ids = [inbox.get(f"id-{label}").turn_id for _, label in messages]  # type: ignore[union-attr]
    assert len(set(turn_ids)) == len(messages)
    for conversation in range(4):
        created = [
            cluster.load(turn_id or "").created_at for turn_id in turn_ids[conversation * 4 : conversation * 4 + 4]
        ]
        assert created == sorted(created), "a conversation's messages started their turns out of order"
    reruns = [row["effect"] for row in cluster.ledger() if row["executions"] > 1]
    print(f"killed w1 with tasks {in_flight_at_kill[0]} in flight; calls re-run under their own key: {reruns}")
