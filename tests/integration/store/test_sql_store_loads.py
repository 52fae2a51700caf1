"""What a load costs: the messages a store saved or loaded are not read again, within bounded memory."""

from __future__ import annotations

import pytest

from agent_runner import AgentTurn, AgentTurnStatus, AiMessage
from store import SqlAgentTurnStore
from store.turns.cache import TurnCache
from tests.integration.store.conftest import ZONED_SQL_DATABASES
from tests.integration.store.store_kit import recording, step, turn_with_history

# Timestamps written and read back must not depend on the session time zone.
pytestmark = pytest.mark.parametrize("sql_url", ZONED_SQL_DATABASES, indirect=True)


def test_a_load_after_this_store_saved_reads_the_header_only(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turn = turns.save(turn_with_history("t-1", 50), -1)
        turn = turns.save(step(turn), turn.version)
        # When the store loads the turn it has just saved
        with recording(turns.engine) as recorded:
            loaded = turns.load("t-1")
        # Then one query (the header) gives the whole snapshot
        assert recorded.statements == ["SELECT"]
        assert loaded == turn
        assert [m.id for m in loaded.messages] == [m.id for m in turn.messages]


def test_a_load_reads_only_the_messages_another_store_added(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as ours, SqlAgentTurnStore(sql_url) as theirs:
        turn = ours.save(turn_with_history("t-1", 40), -1)
        other = theirs.load("t-1")
        for version in range(3):
            other = theirs.save(step(other), version)
        # When the first store loads the turn again
        with recording(ours.engine) as recorded:
            loaded = ours.load("t-1")
        # Then it read the header and the three new messages, not the forty it knew
        assert recorded.statements == ["SELECT", "SELECT"]
        assert loaded == other
        assert len(loaded.messages) == len(turn.messages) + 3


def test_a_store_without_the_history_reads_it_whole_and_then_remembers_it(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as first:
        created = first.save(turn_with_history("t-1", 10), -1)
    with SqlAgentTurnStore(sql_url) as second:
        with recording(second.engine) as recorded:
            assert second.load("t-1") == created
        assert recorded.statements == ["SELECT", "SELECT"]
        with recording(second.engine) as recorded:
            assert second.load("t-1") == created
        assert recorded.statements == ["SELECT"]


def test_a_loaded_snapshot_does_not_share_its_message_list_with_the_store(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turns.save(turn_with_history("t-1", 3), -1)
        first = turns.load("t-1")
        first.messages.append(AiMessage(id="stray", content="appended by a careless caller"))
        assert [m.id for m in turns.load("t-1").messages] == ["t-1-0", "t-1-1", "t-1-2"]


def test_a_store_keeps_a_bounded_number_of_histories_and_still_loads_every_turn(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turns._cache = TurnCache(max_histories=4, max_messages=1_000)
        saved: dict[str, AgentTurn] = {}
        for n in range(12):
            turn = turns.save(turn_with_history(f"t-{n}", 3), -1)
            saved[turn.id] = turns.save(step(turn), turn.version)
        assert turns._cache.history_count == 4
        # Turns whose history was dropped are read in full again, and come back the same
        for turn_id, turn in saved.items():
            assert turns.load(turn_id) == turn
        assert turns._cache.history_count == 4


def test_get_ref_is_one_query_without_messages(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turns.save(turn_with_history("t-1", 100), -1)
        with recording(turns.engine) as recorded:
            ref = turns.get_ref("t-1")
        assert recorded.statements == ["SELECT"]
        assert (ref.turn_id, ref.version, ref.status) == ("t-1", 0, AgentTurnStatus.READY)
