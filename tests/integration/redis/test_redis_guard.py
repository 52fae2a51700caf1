"""RedisConversationGuard against a real Redis: claim, holder, replace, release, data loss."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent_runner.persistence import ConversationGuard, ConversationKey
from store.redis_guard import RedisConversationGuard

pytestmark = pytest.mark.integration

CLAIMERS = 16


def test_the_guard_satisfies_the_conversation_guard_protocol(guard: RedisConversationGuard) -> None:
    assert isinstance(guard, ConversationGuard)


def test_the_first_claim_wins_and_later_claims_see_the_holder(guard: RedisConversationGuard) -> None:
    # Given a conversation nobody holds
    assert guard.holder(ConversationKey("conv-1")) is None

    # When two turns claim it one after the other
    first = guard.claim(ConversationKey("conv-1"), "turn-a")
    second = guard.claim(ConversationKey("conv-1"), "turn-b")

    # Then the first holds it and the second is told so; claiming again as holder is harmless
    assert (first, second) == ("turn-a", "turn-a")
    assert guard.claim(ConversationKey("conv-1"), "turn-a") == "turn-a"
    assert guard.holder(ConversationKey("conv-1")) == "turn-a"
    assert guard.holder(ConversationKey("conv-2")) is None


def test_two_tenants_using_one_conversation_id_hold_two_marks(guard: RedisConversationGuard) -> None:
    # Given tenant acme's conversation conv-1 held by its turn
    assert guard.claim(ConversationKey("conv-1", "acme"), "turn-a") == "turn-a"
    # When tenant globex, and a caller without a tenant, claim their own conv-1
    # Then each gets its own mark, and a release of one leaves the others
    assert guard.claim(ConversationKey("conv-1", "globex"), "turn-g") == "turn-g"
    assert guard.claim(ConversationKey("conv-1"), "turn-n") == "turn-n"
    assert guard.release(ConversationKey("conv-1", "globex"), "turn-g")
    assert guard.holder(ConversationKey("conv-1", "acme")) == "turn-a"
    assert guard.holder(ConversationKey("conv-1")) == "turn-n"
    assert guard.holder(ConversationKey("conv-1", "globex")) is None


def test_replace_moves_the_mark_only_from_the_expected_holder(guard: RedisConversationGuard) -> None:
    # Given turn-a holds the conversation
    guard.claim(ConversationKey("conv-1"), "turn-a")

    # When replacing from a turn that does not hold it
    wrong = guard.replace(ConversationKey("conv-1"), "turn-x", "turn-b")

    # Then nothing moves
    assert wrong is False
    assert guard.holder(ConversationKey("conv-1")) == "turn-a"

    # When replacing from the holder (known to be terminal)
    moved = guard.replace(ConversationKey("conv-1"), "turn-a", "turn-b")

    # Then turn-b holds it, and a second replace from the old holder fails
    assert moved is True
    assert guard.holder(ConversationKey("conv-1")) == "turn-b"
    assert guard.replace(ConversationKey("conv-1"), "turn-a", "turn-c") is False
    assert guard.holder(ConversationKey("conv-1")) == "turn-b"


def test_replace_on_a_conversation_nobody_holds_changes_nothing(guard: RedisConversationGuard) -> None:
    assert guard.replace(ConversationKey("conv-1"), "turn-a", "turn-b") is False
    assert guard.holder(ConversationKey("conv-1")) is None


def test_only_the_holder_can_release(guard: RedisConversationGuard) -> None:
    # Given turn-a holds the conversation
    guard.claim(ConversationKey("conv-1"), "turn-a")

    # When another turn releases it
    # Then the mark stays
    assert guard.release(ConversationKey("conv-1"), "turn-b") is False
    assert guard.holder(ConversationKey("conv-1")) == "turn-a"

    # When the holder releases it
    # Then the conversation is free for a new claim, and a second release fails
    assert guard.release(ConversationKey("conv-1"), "turn-a") is True
    assert guard.holder(ConversationKey("conv-1")) is None
    assert guard.release(ConversationKey("conv-1"), "turn-a") is False
    assert guard.claim(ConversationKey("conv-1"), "turn-b") == "turn-b"


def test_concurrent_claims_leave_exactly_one_holder(guard: RedisConversationGuard) -> None:
    # Given 16 threads that claim one conversation at the same moment
    start = threading.Barrier(CLAIMERS)

    def claim(index: int) -> str:
        start.wait(timeout=10)
        return guard.claim(ConversationKey("conv-1"), f"turn-{index}")

    # When they all claim it
    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        answers = list(pool.map(claim, range(CLAIMERS)))

    # Then exactly one won, and every thread was told the same holder
    winners = [f"turn-{index}" for index, answer in enumerate(answers) if answer == f"turn-{index}"]
    assert len(winners) == 1
    assert set(answers) == set(winners)
    assert guard.holder(ConversationKey("conv-1")) == winners[0]


def test_concurrent_replaces_of_one_terminal_holder_move_the_mark_once(guard: RedisConversationGuard) -> None:
    # Given a terminal holder that 16 threads try to replace at the same moment
    guard.claim(ConversationKey("conv-1"), "turn-old")
    start = threading.Barrier(CLAIMERS)

    def replace(index: int) -> bool:
        start.wait(timeout=10)
        return guard.replace(ConversationKey("conv-1"), "turn-old", f"turn-{index}")

    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        moved = list(pool.map(replace, range(CLAIMERS)))

    # Then one replace won and the mark is on its turn
    assert moved.count(True) == 1
    assert guard.holder(ConversationKey("conv-1")) == f"turn-{moved.index(True)}"


def test_claims_work_again_after_redis_lost_its_data(
    guard: RedisConversationGuard, lose_redis_data: Callable[[], int]
) -> None:
    # Given conversations with holders
    guard.claim(ConversationKey("conv-1"), "turn-a")
    guard.claim(ConversationKey("conv-2"), "turn-b")

    # When Redis loses its data
    assert lose_redis_data() == 2

    # Then the guard knows no holder, and a claim (the runner rebuilding it from the
    # turn store) marks the conversation again
    assert guard.holder(ConversationKey("conv-1")) is None
    assert guard.claim(ConversationKey("conv-1"), "turn-a") == "turn-a"
    assert guard.claim(ConversationKey("conv-1"), "turn-c") == "turn-a"
    assert guard.release(ConversationKey("conv-2"), "turn-b") is False
    assert guard.claim(ConversationKey("conv-2"), "turn-d") == "turn-d"
