"""What a save costs: one transaction, a fixed number of statements, writes independent of history length."""

from __future__ import annotations

import threading

import pytest

from agent_runner import VersionConflictError
from store import SqlAgentTurnStore
from tests.integration.store.conftest import ZONED_SQL_DATABASES
from tests.integration.store.store_kit import recording, step, turn_with_history

# Timestamps written and read back must not depend on the session time zone.
pytestmark = pytest.mark.parametrize("sql_url", ZONED_SQL_DATABASES, indirect=True)


def test_a_step_is_one_transaction(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turn = turns.save(turn_with_history("t-1", 10), -1)
        postgres = turns.engine.dialect.name == "postgresql"
        with recording(turns.engine) as recorded:
            turn = turns.save(step(turn), turn.version)
        if postgres:
            # One autocommitted statement: the guarded UPDATE and the INSERT fed by its RETURNING
            assert (recorded.statements, recorded.commits) == (["WITH"], 0)
        else:
            # The guarded UPDATE ... RETURNING of the header, then the INSERT of the new message
            assert (recorded.statements, recorded.commits) == (["UPDATE", "INSERT"], 1)
        assert turns.load("t-1") == turn
        # A save that adds no message writes the header only
        with recording(turns.engine) as recorded:
            turns.save(turn.model_copy(update={"steps": 99}), turn.version)
        assert recorded.statements == (["WITH"] if postgres else ["UPDATE"])


def test_a_store_that_never_saw_the_turn_reads_its_message_count_once(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as first:
        created = first.save(turn_with_history("t-1", 3), -1)
    with SqlAgentTurnStore(sql_url) as second:
        with recording(second.engine) as recorded:
            saved = second.save(step(created), 0)
        assert recorded.statements == ["SELECT", "UPDATE", "INSERT"]
        assert recorded.commits == 1
        assert second.load("t-1") == saved


def test_the_write_of_a_step_does_not_grow_with_history(sql_url: str) -> None:
    written: dict[int, int] = {}
    with SqlAgentTurnStore(sql_url) as turns:
        for length in (10, 1000):
            turn = turns.save(turn_with_history(f"t-{length}", length), -1)
            with recording(turns.engine) as recorded:
                for _ in range(5):
                    turn = turns.save(step(turn), turn.version)
            written[length] = recorded.parameter_chars
            assert turns.load(turn.id) == turn
    assert written[1000] < written[10] * 1.05


def test_a_wrong_remembered_count_costs_a_retry_not_data(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        created = turns.save(turn_with_history("t-1", 3), -1)
        # Simulate a remembered count that disagrees with the database for the same version
        turns._cache._counts["t-1"] = (0, 1)
        saved = turns.save(step(created), 0)
        assert turns.load("t-1") == saved
        assert [m.id for m in turns.load("t-1").messages] == ["t-1-0", "t-1-1", "t-1-2", "t-1-r3"]


def test_a_snapshot_with_fewer_messages_replaces_the_stored_ones(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        created = turns.save(turn_with_history("t-1", 5), -1)
        shorter = created.model_copy(update={"messages": created.messages[:2]})
        saved = turns.save(shorter, 0)
        assert turns.load("t-1") == saved
        regrown = turns.save(step(saved), 1)
        assert [m.id for m in turns.load("t-1").messages] == ["t-1-0", "t-1-1", "t-1-r2"]
        assert turns.load("t-1") == regrown


def test_threads_racing_on_one_turn_each_win_or_conflict(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turns.save(turn_with_history("t-1", 2), -1)
        wins: list[int] = []
        conflicts: list[int] = []
        errors: list[BaseException] = []

        def advance_repeatedly() -> None:
            for _ in range(15):
                current = turns.load("t-1")
                try:
                    saved = turns.save(step(current), current.version)
                except VersionConflictError:
                    conflicts.append(current.version)
                    continue
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    return
                wins.append(saved.version)

        threads = [threading.Thread(target=advance_repeatedly) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        # Each version was won exactly once, and every step that won kept its message
        assert sorted(wins) == list(range(1, len(wins) + 1))
        final = turns.load("t-1")
        assert final.version == len(wins) and len(final.messages) == 2 + len(wins)
        assert len(wins) + len(conflicts) == 6 * 15


def test_a_save_adding_many_messages_at_once_stores_them_all(sql_url: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns:
        turn = turns.save(turn_with_history("t-1", 1), -1)
        for _ in range(40):
            turn = step(turn)
        saved = turns.save(turn, 0)
        assert turns.load("t-1") == saved and len(saved.messages) == 41
