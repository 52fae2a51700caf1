"""Several processes against one PostgreSQL database: active-turn creation, inbox claims, leases."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing.pool import Pool

import pytest

from agent_runner import AgentTurn, AgentTurnStatus
from agent_runner.persistence import ConversationKey
from store import Inbox, InboxStatus, SqlAgentTurnStore
from tests.integration.store import racers

pytestmark = pytest.mark.integration

WORKERS = 10


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """Spawned worker processes, started once for the module and warmed up before any race."""
    with multiprocessing.get_context("spawn").Pool(WORKERS) as workers:
        workers.map(racers.warm_up, range(WORKERS), chunksize=1)
        yield workers
        workers.close()
        workers.join()


def test_ten_processes_racing_for_a_conversation_create_exactly_one_active_turn(pool: Pool, pg_url: str) -> None:
    # Given 10 processes that each try to start a turn in the same conversation at the same instant
    start_at = time.time() + 0.5
    jobs = [(pg_url, "c-race", index, start_at) for index in range(WORKERS)]
    results = pool.starmap(racers.create_active_turn, jobs, chunksize=1)
    # Then exactly one created it, and every other one was told which turn is active
    created = [turn_id for outcome, turn_id in results if outcome == "created"]
    assert len(created) == 1
    assert [outcome for outcome, _ in results].count("busy") == WORKERS - 1
    assert {turn_id for outcome, turn_id in results if outcome == "busy"} == set(created)
    with SqlAgentTurnStore(pg_url) as turns:
        active = turns.find_active_turn("c-race")
        assert active is not None and active.id == created[0]
        assert [t.id for t in turns.list_turns(conversation_id="c-race")] == created


def test_eight_processes_claim_each_inbox_message_once_and_in_order(pool: Pool, pg_url: str) -> None:
    # Given 200 messages queued over 10 conversations, interleaved
    conversations = [f"conv-{index}" for index in range(10)]
    with Inbox(pg_url) as inbox:
        for number in range(200):
            inbox.enqueue(conversations[number % 10], f"msg-{number:03d}", f"message {number}")
        # When 8 processes claim and complete messages until none is left
        start_at = time.time() + 0.3
        jobs = [(pg_url, conversations, seed, start_at) for seed in range(8)]
        claims = [claim for batch in pool.starmap(racers.claim_until_empty, jobs, chunksize=1) for claim in batch]
        # Then every message was claimed exactly once
        counts = Counter(claim["message_id"] for claim in claims)
        assert len(counts) == 200 and set(counts.values()) == {1}
        # And every claim found all earlier messages of its conversation completed and later ones pending
        assert [claim for claim in claims if claim["out_of_order"]] == []
        for number in range(200):
            stored = inbox.get(f"msg-{number:03d}")
            assert stored is not None and stored.status is InboxStatus.COMPLETED
            assert stored.turn_id == f"turn-msg-{number:03d}"
        assert inbox.conversations_ready() == []


def test_processes_contending_for_a_lease_never_hold_it_together(pool: Pool, pg_url: str) -> None:
    start_at = time.time() + 0.3
    jobs = [(pg_url, f"owner-{index}", start_at, 1.0) for index in range(6)]
    holds = sorted(
        (hold for batch in pool.starmap(racers.hold_lease_repeatedly, jobs, chunksize=1) for hold in batch),
        key=lambda hold: hold[1],
    )
    assert len(holds) >= 20
    # No two holders at once: each hold starts after the previous one ended
    overlaps = [(a, b) for a, b in zip(holds, holds[1:], strict=False) if b[1] < a[2]]
    assert overlaps == []
    # Fences strictly increase in the order the lease was taken
    fences = [fence for fence, _, _ in holds]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_a_conversation_turn_blocks_its_inbox_until_it_ends(pg_url: str) -> None:
    with Inbox(pg_url) as inbox, SqlAgentTurnStore(pg_url) as turns:
        inbox.enqueue("c-1", "m-1", "first")
        inbox.enqueue("c-2", "m-2", "second")
        turn = turns.save(AgentTurn(id="t-1", agent_id="a", root_turn_id="t-1", conversation_id="c-1"), -1)
        assert inbox.conversations_ready() == [ConversationKey("c-2")]
        turns.save(turn.model_copy(update={"status": AgentTurnStatus.COMPLETED}), 0)
        assert inbox.conversations_ready() == [ConversationKey("c-1"), ConversationKey("c-2")]
