"""Redis loses its data mid-run: the store stays the truth, the guard is repaired, and workers go on.

This is the one test that empties a Redis database (FLUSHDB), so it runs on a database
number of its own (`AGENT_RUNNER_TEST_REDIS_FLUSH_DB`, default 14), never on the shared one.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from agent_runner import AgentConversationBusyException, AgentRunner, AgentTurnStatus, ToolMessage
from agent_runner.persistence import ConversationKey
from agent_runner.worker import AgentWorker
from store import RedisConversationGuard, RedisTurnLease, SqlAgentTurnStore, SqlChatMemoryProvider
from tests.helpers.jsonl import read_jsonl
from tests.integration.embedded_worker import embedded_fleet
from tests.integration.embedded_worker.embedded_fleet import (
    history_problems,
    loader,
    turn_with_status,
    wait_for,
)

pytestmark = pytest.mark.integration

CONVERSATIONS = [f"conversation-{n}" for n in range(4)]
ACTIVE = [s for s in AgentTurnStatus if not s.is_terminal]


class ActiveTurnSampler:
    """Counts, over and over while the test runs, the non-terminal turns of each conversation."""

    def __init__(self, turns: SqlAgentTurnStore) -> None:
        self.turns = turns
        self.most: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            active = self.turns.list_turns(statuses=ACTIVE, limit=1000)
            counts = Counter(t.conversation_id for t in active if t.conversation_id is not None)
            for conversation, count in counts.items():
                self.most[conversation] = max(self.most[conversation], count)
            self.samples += 1

    def __enter__(self) -> ActiveTurnSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def released(guard: RedisConversationGuard, conversation_id: str) -> Callable[[], bool]:
    """A condition for `wait_for`: no turn holds the conversation's guard mark."""
    return lambda: guard.holder(ConversationKey(conversation_id)) is None


def test_redis_flushed_mid_run_keeps_one_active_turn_per_conversation_and_work_continues(
    pg_url: str, flush_redis_url: str, flush_prefix: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with ExitStack() as stack:
        embedded_fleet.configure(ledger)
        stack.callback(embedded_fleet.configure, None)
        turns = stack.enter_context(SqlAgentTurnStore(pg_url))
        memories = stack.enter_context(SqlChatMemoryProvider(turns.engine))
        redis: Redis[Any] = Redis.from_url(flush_redis_url, socket_timeout=5)
        stack.callback(redis.close)
        # Given two runners, each with its Redis guard, served by a worker on Redis leases;
        # every step takes the lease anew, so the flush is followed by fresh acquisitions
        runners: list[AgentRunner] = []
        workers: list[AgentWorker] = []
        guards: list[RedisConversationGuard] = []
        for _ in range(2):
            guard = stack.enter_context(RedisConversationGuard(flush_redis_url, prefix=flush_prefix))
            lease = stack.enter_context(RedisTurnLease(flush_redis_url, prefix=flush_prefix))
            runner = AgentRunner(
                turn_store=turns, agent_loader=loader(), chat_memory_provider=memories, conversation_guard=guard
            )
            worker = AgentWorker(
                runner, lease=lease, concurrency=2, lease_ttl=3, poll_interval=0.02, max_steps_per_claim=1
            )
            stack.callback(worker.stop, 10)
            runners.append(runner)
            workers.append(worker)
            guards.append(guard)
        sampler = stack.enter_context(ActiveTurnSampler(turns))
        for worker in workers:
            worker.start()
        # And one turn in each of four conversations, each calling a slow tool three times
        firsts = {c: runners[n % 2].start("pauser", "first", conversation_id=c) for n, c in enumerate(CONVERSATIONS)}
        for conversation in CONVERSATIONS:
            with pytest.raises(AgentConversationBusyException):
                runners[1].start("pauser", "too early", conversation_id=conversation)
        wait_for(
            lambda: all(turns.load(t.id).steps >= 2 for t in firsts.values()), 20, "every first turn to make progress"
        )
        fences_before = {c: turns.load(t.id).lease_fence or 0 for c, t in firsts.items()}
        # When Redis loses everything (leases, fence counters, guard marks)
        redis.flushdb()
        assert all(guards[0].holder(ConversationKey(c)) is None for c in CONVERSATIONS)
        # Then the store still refuses a second active turn, and the guard is repaired from it
        for conversation in CONVERSATIONS:
            with pytest.raises(AgentConversationBusyException) as busy:
                runners[1].start("pauser", "second too early", conversation_id=conversation)
            assert busy.value.active_turn_id == firsts[conversation].id
            assert guards[1].holder(ConversationKey(conversation)) == firsts[conversation].id
        # And the workers finish the interrupted turns: leases taken after the flush carry
        # fences seeded from the Redis clock, above every fence saved before it
        for conversation, first in firsts.items():
            done = wait_for(
                turn_with_status(turns, first.id, AgentTurnStatus.COMPLETED),
                30,
                f"turn {first.id} of {conversation} to complete",
            )
            assert done.lease_fence is not None and done.lease_fence > fences_before[conversation]
            assert history_problems(done) == []
            assert [m.content for m in done.messages if isinstance(m, ToolMessage)] == [
                "paused 0",
                "paused 1",
                "paused 2",
            ]
            # the guard mark is released right after the turn's terminal save
            wait_for(released(guards[0], conversation), 5, f"the guard of {conversation} to clear")
        # And each conversation takes its next turn, which runs to completion too
        seconds = {c: runners[0].start("pauser", "second", conversation_id=c) for c in CONVERSATIONS}
        for second in seconds.values():
            wait_for(turn_with_status(turns, second.id, AgentTurnStatus.COMPLETED), 30, "second turns to complete")
        for worker in workers:
            assert worker.stop(timeout=10)
    # No conversation was ever seen with two active turns
    assert sampler.samples > 10
    assert set(sampler.most.values()) == {1}
    # A tool call may have run again after the flush freed its lease mid-call, but always
    # under its own idempotency key, and its result was recorded once (checked above)
    runs = Counter(record["key"] for record in read_jsonl(ledger))
    assert len(runs) == 3 * 2 * len(CONVERSATIONS)
    assert max(runs.values()) <= 2
