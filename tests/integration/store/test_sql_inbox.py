"""Inbox behaviour on SQLite and PostgreSQL: idempotent enqueue, ordered claims, retries and failures."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from agent_runner import AgentTurn, AgentTurnStatus
from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from store import Inbox, InboxMessage, InboxStatus, SqlAgentTurnStore


@pytest.fixture
def inbox(sql_url: str) -> Iterator[Inbox]:
    with Inbox(sql_url) as queue:
        yield queue


def test_enqueue_is_idempotent_and_numbers_each_conversation(inbox: Inbox) -> None:
    first = inbox.enqueue("c-1", "m-1", "hello")
    assert first == InboxMessage("m-1", "c-1", "hello", 1, InboxStatus.PENDING)
    assert inbox.enqueue("c-1", "m-1", "hello again") == first
    assert inbox.enqueue("c-1", "m-2", "second").sequence == 2
    assert inbox.enqueue("c-2", "m-3", "other conversation").sequence == 1
    assert inbox.get("m-1") == first
    assert inbox.get("missing") is None


def test_claims_follow_the_queue_one_message_at_a_time(inbox: Inbox) -> None:
    for number in range(3):
        inbox.enqueue("c-1", f"m-{number}", f"text {number}")
    claimed = inbox.claim_next(ConversationKey("c-1"))
    assert claimed is not None and (claimed.message_id, claimed.status) == ("m-0", InboxStatus.PROCESSING)
    # Nothing more while one message is PROCESSING
    assert inbox.claim_next(ConversationKey("c-1")) is None
    assert inbox.mark_completed("m-0", "turn-0") is True
    assert inbox.get("m-0") == InboxMessage("m-0", "c-1", "text 0", 1, InboxStatus.COMPLETED, turn_id="turn-0")
    following = inbox.claim_next(ConversationKey("c-1"))
    assert following is not None and following.message_id == "m-1"
    assert inbox.claim_next(ConversationKey("unknown")) is None


def test_a_released_message_is_claimed_again_before_later_ones(inbox: Inbox) -> None:
    inbox.enqueue("c-1", "m-0", "first")
    inbox.enqueue("c-1", "m-1", "second")
    claimed = inbox.claim_next(ConversationKey("c-1"))
    assert claimed is not None
    assert inbox.release_for_retry(claimed.message_id) is True
    assert inbox.release_for_retry(claimed.message_id) is False
    again = inbox.claim_next(ConversationKey("c-1"))
    assert again is not None and again.message_id == "m-0"


def test_a_failed_message_unblocks_the_rest_of_its_conversation(inbox: Inbox) -> None:
    inbox.enqueue("c-1", "m-0", "poison")
    inbox.enqueue("c-1", "m-1", "fine")
    assert inbox.claim_next(ConversationKey("c-1")) is not None
    assert inbox.mark_failed("m-0", "agent not found") is True
    assert inbox.mark_failed("m-0", "again") is False
    failed = inbox.get("m-0")
    assert failed is not None and (failed.status, failed.error) == (InboxStatus.FAILED, "agent not found")
    following = inbox.claim_next(ConversationKey("c-1"))
    assert following is not None and following.message_id == "m-1"
    # A PENDING message can be failed directly, and COMPLETED ones cannot change any more
    inbox.enqueue("c-2", "m-2", "never")
    assert inbox.mark_failed("m-2", "dropped") is True
    assert inbox.mark_completed("m-1", "turn-1") is True
    assert inbox.mark_completed("m-1", "turn-2") is False
    assert inbox.release_for_retry("m-1") is False


def test_ready_conversations_have_pending_work_and_no_active_turn(sql_url: str, inbox: Inbox) -> None:
    inbox.enqueue("c-busy", "m-0", "waits for the active turn")
    inbox.enqueue("c-processing", "m-1", "claimed")
    inbox.enqueue("c-processing", "m-2", "behind the claimed one")
    inbox.enqueue("c-free", "m-3", "ready")
    inbox.enqueue("c-done", "m-4", "done")
    assert inbox.claim_next(ConversationKey("c-processing")) is not None
    done = inbox.claim_next(ConversationKey("c-done"))
    assert done is not None and inbox.mark_completed(done.message_id, "t")
    with SqlAgentTurnStore(sql_url) as turns:
        active = AgentTurn(id="t-busy", agent_id="a", root_turn_id="t-busy", conversation_id="c-busy")
        saved = turns.save(active, -1)
        assert inbox.conversations_ready() == [ConversationKey("c-free")]
        turns.save(saved.model_copy(update={"status": AgentTurnStatus.CANCELLED}), 0)
    assert inbox.conversations_ready() == [ConversationKey("c-busy"), ConversationKey("c-free")]
    assert inbox.conversations_ready(limit=1) == [ConversationKey("c-busy")]


def test_stale_claims_lists_only_processing_messages_claimed_before_the_cutoff(inbox: Inbox) -> None:
    # Given one claimed and one pending message
    inbox.enqueue("c-1", "m-0", "first")
    inbox.enqueue("c-2", "m-1", "other")
    claimed = inbox.claim_next(ConversationKey("c-1"))
    assert claimed is not None
    # Then a cutoff in the future finds the claim, and one in the past finds nothing
    future = utcnow() + timedelta(minutes=1)
    assert [m.message_id for m in inbox.stale_claims(future)] == ["m-0"]
    assert inbox.stale_claims(utcnow() - timedelta(minutes=1)) == []
    # And a completed claim is no longer stale
    inbox.mark_completed("m-0", "turn-0")
    assert inbox.stale_claims(future) == []


def test_a_message_remembers_the_agent_tenant_and_metadata_of_its_turn(inbox: Inbox) -> None:
    queued = inbox.enqueue("c-1", "m-1", "hello", agent_id="helper", tenant_id="t", metadata={"user": "u-1"})
    assert (queued.agent_id, queued.tenant_id, queued.metadata) == ("helper", "t", {"user": "u-1"})
    assert queued.conversation == ConversationKey("c-1", "t")
    assert inbox.claim_next(ConversationKey("c-1")) is None  # the conversation of no tenant with that id
    claimed = inbox.claim_next(ConversationKey("c-1", "t"))
    assert claimed is not None and (claimed.agent_id, claimed.tenant_id, claimed.metadata) == (
        "helper",
        "t",
        {"user": "u-1"},
    )
    plain = inbox.enqueue("c-2", "m-2", "no extras")
    assert (plain.agent_id, plain.tenant_id, plain.metadata) == (None, None, {})


def test_a_conversation_has_waiting_messages_until_each_started_its_turn_or_failed(inbox: Inbox) -> None:
    # Given a tenant's conversation with two queued messages, and another tenant's of the same id
    assert not inbox.has_waiting(ConversationKey("c-1", "acme"))
    inbox.enqueue("c-1", "m-1", "first", tenant_id="acme")
    inbox.enqueue("c-1", "m-2", "second", tenant_id="acme")
    assert inbox.has_waiting(ConversationKey("c-1", "acme")) and not inbox.has_waiting(ConversationKey("c-1", "globex"))
    # When the first is claimed and starts its turn, it no longer waits, the second still does
    claimed = inbox.claim_next(ConversationKey("c-1", "acme"))
    assert claimed is not None and inbox.has_waiting(ConversationKey("c-1", "acme"))
    assert inbox.mark_completed("m-1", "t-1") and inbox.has_waiting(ConversationKey("c-1", "acme"))
    # Then once the second failed, nothing waits
    assert inbox.mark_failed("m-2", "no agent")
    assert not inbox.has_waiting(ConversationKey("c-1", "acme"))
