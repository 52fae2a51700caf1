"""What a SQL turn store remembers of the turns it saw: bounded message counts and histories."""

from __future__ import annotations

from agent_runner import AgentTurnStatus
from store.turns.cache import TurnCache
from tests.integration.store.store_kit import turn_with_history


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
