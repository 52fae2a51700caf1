"""The beat sweeps recover what a dead worker or a lost message left behind, and do no harm when repeated."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent_runner import AgentRunner, AgentTurn, AgentTurnStatus, AgentTurnStore
from agent_runner.ids import queued_turn_id
from agent_runner.persistence import ConversationKey, EventScope
from store import InboxStatus, RedisTurnLease
from tests.integration.celery_workers.celery_agents import LEDGER_URL_VARIABLE
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.sweeps import sweep_due_retries, sweep_inbox, sweep_stale_turns

pytestmark = pytest.mark.integration


def _spec(kind: str, label: str, **extra: object) -> str:
    return json.dumps({"kind": kind, "label": label, **extra})


def _effects(cluster: Cluster) -> list[tuple[str, int]]:
    return [(row["effect"], row["executions"]) for row in cluster.ledger()]


def test_stale_turn_sweep_recovers_a_turn_whose_lease_holder_died(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a turn a worker stepped once under its lease, then died without a word
    monkeypatch.setenv(LEDGER_URL_VARIABLE, cluster.settings.database_url)
    turn = cluster.runner.start("worker-agent", _spec("steps", "orphan", steps=2))
    cluster.purge_queue()
    with RedisTurnLease(cluster.redis_url, prefix=cluster.settings.redis_prefix) as lease:
        held = lease.acquire(turn.id, "worker-that-dies", cluster.settings.lease_ttl_ms)
        assert held is not None
        fenced = turn.model_copy(update={"lease_fence": held.fence})
        running = _quiet_runner(cluster).step(fenced).turn
    assert running.status is AgentTurnStatus.RUNNING

    # When the sweep runs while the lease is still live (before a worker start, which may
    # take longer than the TTL on a busy machine), then after it expired
    assert sweep_stale_turns(cluster.wiring) == 0
    assert cluster.load(turn.id).version == running.version
    cluster.start_worker("w1")
    cluster.wait_for(lambda: sweep_stale_turns(cluster.wiring) == 1, 10, "the sweep to re-enqueue the turn")

    # Then a worker finishes the turn, and every side effect happened once
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the recovered turn to end")
    assert cluster.load(turn.id).status is AgentTurnStatus.COMPLETED
    assert _effects(cluster) == [("orphan:w0", 1), ("orphan:w1", 1)]


def test_stale_turn_sweep_recovers_a_ready_turn_whose_message_was_lost(cluster: Cluster) -> None:
    # Given a started turn whose message vanished from the broker
    turn = cluster.runner.start("worker-agent", _spec("plain", "lost"))
    assert cluster.purge_queue() == 1

    # When the sweep runs at once (nothing to do) and once the turn has been READY for a lease TTL
    assert sweep_stale_turns(cluster.wiring) == 0
    cluster.start_worker("w1")
    cluster.wait_for(lambda: sweep_stale_turns(cluster.wiring) == 1, 10, "the sweep to re-enqueue the turn")

    # Then it runs
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the turn to end")
    assert cluster.load(turn.id).status is AgentTurnStatus.COMPLETED


def test_retry_sweep_recovers_a_due_retry_whose_eta_message_was_purged(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a turn scheduled for a retry in 1 s, whose ETA message is purged from the queue
    monkeypatch.setenv(LEDGER_URL_VARIABLE, cluster.settings.database_url)
    turn = cluster.runner.start("worker-agent", _spec("retry", "purged", failures=1, after=1.0))
    runner = _quiet_runner(cluster, dispatch=True)
    scheduled = runner.step(runner.step(turn).turn).turn
    assert scheduled.status is AgentTurnStatus.RETRY_SCHEDULED
    assert cluster.purge_queue() == 2  # the start message and the retry's ETA message

    # When the sweep runs before the retry is overdue, and again after
    assert sweep_due_retries(cluster.wiring) == 0
    cluster.start_worker("w1")
    time.sleep(1.0 + cluster.settings.sweep_interval_s)
    assert cluster.load(turn.id).status is AgentTurnStatus.RETRY_SCHEDULED  # nothing else would move it
    assert sweep_due_retries(cluster.wiring) == 1

    # Then the retry runs once and the turn completes
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the retried turn to end")
    assert cluster.load(turn.id).status is AgentTurnStatus.COMPLETED
    assert [tries for tries, _ in cluster.attempts().values()] == [2]
    assert _effects(cluster) == [("purged:flaky", 1)]


def test_retry_sweep_runs_a_wait_longer_than_the_eta_limit(make_cluster: Callable[..., Cluster]) -> None:
    # Given workers that send at most 0.5 s of ETA to the broker, and a retry 2 s away
    cluster = make_cluster(AGENT_RUNNER_MAX_ETA_S="0.5")
    cluster.start_worker("w1")
    turn = cluster.runner.start("worker-agent", _spec("retry", "long", failures=1, after=2.0))
    cluster.wait_for(lambda: cluster.load(turn.id).status is AgentTurnStatus.RETRY_SCHEDULED, 20, "the retry")
    due = cluster.load(turn.id).next_retry_at
    assert due is not None

    # When the sweep runs before and after the retry is due
    assert sweep_due_retries(cluster.wiring) == 0
    cluster.wait_for(lambda: sweep_due_retries(cluster.wiring) == 1, 10, "the sweep to send the due retry")

    # Then the turn completes, retried once, not before it was due
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, 20, "the retried turn to end")
    [(tries, last_at)] = cluster.attempts().values()
    assert tries == 2
    assert last_at >= due.timestamp() - 0.05


class _ParentUnreachable:
    """A turn store through which a child cannot reach its parent: the worker dies right after the child's save."""

    def __init__(self, inner: AgentTurnStore, parent_id: str) -> None:
        self._inner = inner
        self._parent_id = parent_id

    def load(self, turn_id: str) -> AgentTurn:
        if turn_id == self._parent_id:
            raise RuntimeError("the worker died here")
        return self._inner.load(turn_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_retry_sweep_resumes_a_parent_whose_last_child_ended_without_telling_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a parent waiting for two children that both ended, but whose worker died before
    # recording them in the parent
    monkeypatch.setenv(LEDGER_URL_VARIABLE, cluster.settings.database_url)
    parent = cluster.runner.start("worker-agent", _spec("fanout", "orphans", children=2))
    quiet = _quiet_runner(cluster)
    waiting = quiet.step(quiet.step(parent).turn).turn  # the delegation calls, then the children
    assert waiting.status is AgentTurnStatus.WAITING_FOR_CHILD
    dying = AgentRunner(
        turn_store=_ParentUnreachable(cluster.turn_store, parent.id),
        agent_loader=cluster.runner.agent_loader,
        policy=cluster.settings.policy(),
    )
    for link in waiting.children:
        child = cluster.load(link.child_turn_id)
        while not child.is_terminal:
            try:
                child = dying.step(child).turn
            except RuntimeError:
                child = cluster.load(child.id)
    cluster.purge_queue()
    assert cluster.load(parent.id).status is AgentTurnStatus.WAITING_FOR_CHILD
    cluster.start_worker("w1")

    # When the sweep runs after the parent has waited a lease TTL
    time.sleep(cluster.settings.lease_ttl_s)
    sweep_due_retries(cluster.wiring)

    # Then the parent is resumed and completes with both children's outputs
    cluster.wait_for(lambda: cluster.load(parent.id).is_terminal, 20, "the parent to end")
    final = cluster.load(parent.id)
    assert final.status is AgentTurnStatus.COMPLETED
    assert [link.status for link in final.children] == [AgentTurnStatus.COMPLETED] * 2
    assert _effects(cluster) == [("orphans.c0:w0", 1), ("orphans.c1:w0", 1)]


def test_inbox_sweep_starts_an_idle_conversation_and_turn_ends_start_the_next_message(cluster: Cluster) -> None:
    # Given three messages queued for a conversation that has no turn, and nothing asked to run them
    inbox = cluster.wiring.inbox
    for label in ("m1", "m2", "m3"):
        inbox.enqueue("conv-1", f"msg-{label}", label)
    cluster.start_worker("w1")
    time.sleep(0.5)
    assert inbox.get("msg-m1").status is InboxStatus.PENDING  # type: ignore[union-attr]

    # When the inbox sweep runs (twice, as two beats by mistake would)
    assert sweep_inbox(cluster.wiring) == 1
    sweep_inbox(cluster.wiring)

    # Then the first message starts a turn, and each turn's end starts the next message
    def all_done() -> bool:
        return all(inbox.get(f"msg-{label}").status is InboxStatus.COMPLETED for label in ("m1", "m2", "m3"))  # type: ignore[union-attr]

    cluster.wait_for(all_done, 20, "the three inbox messages")
    cluster.wait_for(lambda: cluster.turn_store.find_active_turn("conv-1") is None, 10, "the last turn to end")
    turns = cluster.turn_store.list_turns(conversation_id="conv-1")
    assert len(turns) == 3
    assert all(t.status is AgentTurnStatus.COMPLETED for t in turns)
    started = {inbox.get(f"msg-{label}").turn_id for label in ("m1", "m2", "m3")}  # type: ignore[union-attr]
    assert started == {t.id for t in turns}
    # each under the id derived from its message, which its MESSAGE_QUEUED named
    assert started == {queued_turn_id("conv-1", f"msg-{label}") for label in ("m1", "m2", "m3")}
    queued = [
        e for e in cluster.turn_store.read_events(EventScope.conversation("conv-1")) if e.type.value == "MESSAGE_QUEUED"
    ]
    assert {e.turn_id for e in queued} == started
    assert _effects(cluster) == [("inbox:m1", 1), ("inbox:m2", 1), ("inbox:m3", 1)]


def test_inbox_sweep_settles_a_claim_left_by_a_worker_that_died(cluster: Cluster) -> None:
    # Given a message claimed by a dispatcher that died before starting its turn
    inbox = cluster.wiring.inbox
    inbox.enqueue("conv-2", "msg-a", "a")
    claimed = inbox.claim_next(ConversationKey("conv-2"))
    assert claimed is not None and claimed.status is InboxStatus.PROCESSING

    # When the inbox sweep runs at once (a live claim is left alone), then after the claim is
    # two lease TTLs old (a worker started in between, which may take a while on a busy machine)
    sweep_inbox(cluster.wiring)
    assert inbox.get("msg-a").status is InboxStatus.PROCESSING  # type: ignore[union-attr]
    cluster.start_worker("w1")
    time.sleep(2 * cluster.settings.lease_ttl_s)
    sweep_inbox(cluster.wiring)

    # Then the message goes back to the queue and its turn runs once
    cluster.wait_for(
        lambda: inbox.get("msg-a").status is InboxStatus.COMPLETED,  # type: ignore[union-attr]
        20,
        "the message to start its turn",
    )
    _wait_turn_of(cluster, "msg-a")
    assert _effects(cluster) == [("inbox:a", 1)]


def test_celery_beat_schedules_the_sweeps(cluster: Cluster) -> None:
    # Given an idle conversation with a queued message, a worker and a beat
    cluster.wiring.inbox.enqueue("conv-beat", "msg-beat", "beat")
    cluster.start_worker("w1")
    cluster.start_beat()

    # Then beat's inbox sweep (every second here) gets the message processed
    cluster.wait_for(
        lambda: cluster.wiring.inbox.get("msg-beat").status is InboxStatus.COMPLETED,  # type: ignore[union-attr]
        20,
        "beat to dispatch the inbox message",
    )
    _wait_turn_of(cluster, "msg-beat")
    assert _effects(cluster) == [("inbox:beat", 1)]


def _wait_turn_of(cluster: Cluster, message_id: str) -> None:
    message = cluster.wiring.inbox.get(message_id)
    assert message is not None and message.turn_id is not None
    turn_id = message.turn_id
    cluster.wait_for(lambda: cluster.load(turn_id).is_terminal, 20, f"the turn of {message_id} to end")
    assert cluster.load(turn_id).status is AgentTurnStatus.COMPLETED


def _quiet_runner(cluster: Cluster, *, dispatch: bool = False) -> AgentRunner:
    """A runner in the test process over the cluster's store: it sends messages only if `dispatch`."""
    return AgentRunner(
        turn_store=cluster.turn_store,
        agent_loader=cluster.runner.agent_loader,
        chat_memory_provider=cluster.runner.chat_memory_provider,
        policy=cluster.settings.policy(),
        dispatcher=cluster.wiring.dispatcher if dispatch else None,
    )


def test_a_sweep_that_meets_a_dead_database_logs_one_warning_line_and_runs_again_next_tick(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.celery_app import beat
    from workers.wiring import build_wiring

    # Given a worker whose database does not answer (nothing listens on its port)
    dead = dataclasses.replace(cluster.settings, database_url="postgresql+psycopg://postgres@127.0.0.1:1/agents")
    monkeypatch.setattr(beat, "current", lambda: build_wiring(dead, cluster.celery_app))
    entries = [beat.SWEEP_ENTRIES[name] for name in ("inbox", "stale_turns", "due_retries", "deadlines")]
    # When beat's sweeps run on it
    with caplog.at_level(logging.WARNING, logger="workers"):
        outcomes = [entry() for entry in entries]
    # Then each is skipped with one warning line and no traceback
    assert outcomes == [0, 0, 0, 0]
    lines = [r for r in caplog.records if r.name.startswith("workers")]
    assert len(lines) == len(entries), [r.getMessage() for r in lines]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in lines)
    assert all("runs again at the next tick" in r.getMessage() for r in lines)
    # And once the database answers again, the same sweeps simply run
    monkeypatch.setattr(beat, "current", lambda: cluster.wiring)
    assert [entry() for entry in entries] == [0, 0, 0, 0]
