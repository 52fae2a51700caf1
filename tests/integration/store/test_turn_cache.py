"""What a SQL turn store remembers of the turns it saw: bounded message counts and histories."""

from __future__ import annotations

from datetime import timedelta

from agent_runner import AgentTurnStatus
from store.turns.cache import TurnCache
from tests.integration.store.store_kit import step, turn_with_history


def test_histories_are_bounded_by_turns_and_by_messages() -> None:
    histories = TurnCache(max_histories=3, max_messages=25)
    turns = [turn_with_history(f"t-{n}", 5) for n in range(5)]
    for turn in turns:
        histories.remember(turn)
    # Three turns at most, least recently used dropped first
    assert histories.history_count == 3 and histories.message_count == 15
    assert histories.history("t-0") is None and histories.history("t-1") is None
    assert histories.history("t-2") is not None  # now the most recently used
    # A longer history pushes older entries out until the message budget holds
    histories.remember(turn_with_history("long", 20))
    assert histories.message_count <= 25
    assert histories.history("long") is not None and histories.history("t-3") is None
    # A history over the whole budget is not kept, nor is a terminal turn's
    histories.remember(turn_with_history("huge", 26))
    assert histories.history("huge") is None
    ended = turn_with_history("long", 20).model_copy(update={"status": AgentTurnStatus.COMPLETED})
    histories.remember(ended)
    assert histories.history("long") is None
    assert histories.message_count == sum(entry[1] for entry in histories._entries.values())
    # The message counts of every turn are remembered, within their own bound
    version = turns[0].version
    assert histories.count("t-0", version) == 5 and histories.count("t-0", version + 1) is None


def test_the_newest_snapshot_is_kept_and_an_older_one_read_late_does_not_replace_it() -> None:
    cache = TurnCache()
    older = turn_with_history("t", 3)
    newer = step(older).model_copy(update={"version": older.version + 1})
    assert cache.snapshot("t") is None
    cache.remember(older)
    assert cache.snapshot("t") is older
    cache.remember(newer)
    # A read that began before the save and ends after it brings the older snapshot back
    cache.remember(older)
    assert cache.snapshot("t") is newer
    assert cache.history("t") == (newer.messages, 4)
    # The same version read again (a cancel flag set meanwhile) replaces it
    flagged = newer.model_copy(update={"cancel_requested": True})
    cache.remember(flagged)
    assert cache.snapshot("t") is flagged
    # A turn created again under the id of one that was pruned replaces it, whatever its version
    again = turn_with_history("t", 1).model_copy(update={"created_at": older.created_at + timedelta(days=1)})
    cache.remember(again)
    assert cache.snapshot("t") is again
    cache.remember(flagged)
    # A terminal turn takes no more steps: nothing is kept for it
    cache.remember(flagged.model_copy(update={"version": newer.version + 1, "status": AgentTurnStatus.COMPLETED}))
    assert cache.snapshot("t") is None
