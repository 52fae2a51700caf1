"""The per-step statements on the driver (PostgreSQL): prepared, HOT, one round trip, and the pool left sound.

On PostgreSQL, `SqlAgentTurnStore` runs a step's save and a load as prepared statements on
the psycopg connection of a pooled connection, unless something watches the engine's
statements (then SQLAlchemy runs the same save; the statement-recording tests cover that).
No listener is registered on the engines here, so every save and load below takes the
driver path.
"""

from __future__ import annotations

import gc
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import store
from agent_runner import (
    AgentActionMessage,
    AgentEvent,
    AgentEventType,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    StoreUnavailableError,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from agent_runner.ids import utcnow
from agent_runner.persistence import EventScope
from store.schema import turns as turns_table
from tests.conftest import libpq_url
from tests.integration.store.store_kit import killed_mid_statement, recording, step, turn_with_history

pytestmark = pytest.mark.integration


def schema_of(url: str) -> str:
    options = make_url(url).query["options"]
    assert isinstance(options, str)
    return options.split("search_path=", 1)[1]


def table_updates(admin: psycopg.Connection[tuple[Any, ...]], schema: str, expected: int) -> tuple[int, int]:
    """(updates, HOT updates) of agent_turns once the server's statistics count `expected` updates.

    Backends report their counters when they go idle or exit; the caller has closed them.
    """
    row: tuple[Any, ...] | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'agent_turns'",
            [schema],
        ).fetchone()
        if row is not None and row[0] >= expected:
            break
        time.sleep(0.2)
    assert row is not None
    return int(row[0]), int(row[1])


def test_the_saves_of_a_running_turn_are_hot_updates(pg_url: str, admin: psycopg.Connection[tuple[Any, ...]]) -> None:
    # Given a turn saved READY, then RUNNING, then stepped 6 times with the status unchanged
    # (few enough that every row version fits on the turn's page without pruning, which
    # other sessions of a shared server may hold back)
    with store.SqlAgentTurnStore(pg_url) as turns:
        turn = turns.save(turn_with_history("t-1", 3), -1)
        for _ in range(7):
            turn = turns.save(step(turn).model_copy(update={"updated_at": utcnow()}), turn.version)
        ended = turns.save(
            turn.model_copy(update={"status": AgentTurnStatus.COMPLETED, "updated_at": utcnow()}), turn.version
        )
    # Then every save that kept the status changed no indexed column: a HOT update
    updates, hot = table_updates(admin, schema_of(pg_url), 8)
    assert (updates, hot) == (8, 6)
    with store.SqlAgentTurnStore(pg_url) as turns:
        assert turns.load("t-1") == ended


def test_a_save_runs_as_a_prepared_statement_on_a_connection_of_the_pool(pg_url: str) -> None:
    engine = store.make_engine(pg_url)
    try:
        turns = store.SqlAgentTurnStore(engine)
        turn = turns.save(turn_with_history("t-1", 2), -1)
        turn = turns.save(step(turn), turn.version)
        assert turns.load("t-1") == turn
        # The store kept one connection out of the pool; closed, it hands it back
        turns.close()
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        # And that session (the pool's only one) has the save and the load prepared
        with engine.connect() as connection:
            prepared = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
        assert engine.pool.size() >= 1 and engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    assert any(text.startswith("WITH header AS (") for text in prepared)
    assert any("probe.message_id" in text for text in prepared)


def test_a_pooled_connection_comes_back_from_a_direct_save_ready_for_transactions(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as turns:
        turn = turns.save(turn_with_history("t-1", 2), -1)
        turns.save(step(turn), turn.version)
        # When SQLAlchemy then writes in a transaction on the same pooled connection and rolls it back
        with turns.engine.connect() as connection:
            connection.execute(sa.update(turns_table).where(turns_table.c.id == "t-1").values(agent_id="changed"))
            connection.rollback()
        # Then nothing of it stays: the connection was not left in autocommit
        assert turns.load("t-1").agent_id == "a"


def test_a_load_reads_what_another_store_added_in_one_statement(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as ours, store.SqlAgentTurnStore(pg_url) as theirs:
        turn = ours.save(turn_with_history("t-1", 5), -1)
        # Given another store (another process) that stepped the turn three times since
        other = theirs.load("t-1")
        for _ in range(3):
            other = theirs.save(step(other), other.version)
        # When ours loads it, remembering the first five messages
        loaded = ours.load("t-1")
        # Then it has the header and all eight messages, the remembered ones reused as they are
        assert loaded == other
        assert loaded.messages[0] is turn.messages[0]
        assert [m.id for m in loaded.messages] == [m.id for m in other.messages]


def test_a_load_rereads_a_history_rewritten_by_another_store(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as ours, store.SqlAgentTurnStore(pg_url) as theirs:
        turn = ours.save(turn_with_history("t-1", 4), -1)
        other = theirs.load("t-1")
        # Given another store that cut the history to two messages and appended two different ones
        rewritten = [*other.messages[:2], UserMessage(id="new-2", content="x"), AiMessage(id="new-3", content="y")]
        other = theirs.save(other.model_copy(update={"messages": rewritten[:2]}), other.version)
        other = theirs.save(other.model_copy(update={"messages": rewritten}), other.version)
        # Then ours, which remembers the old four, notices that message 3 differs and reads them all
        loaded = ours.load("t-1")
        assert loaded == other
        assert [m.id for m in loaded.messages] == [m.id for m in rewritten]
        assert turn.messages[3].id != loaded.messages[3].id


def test_a_missing_turn_is_not_found_on_the_driver_path(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as turns:
        with pytest.raises(TurnNotFound):
            turns.load("nope")
        with pytest.raises(TurnNotFound):
            turns.get_ref("nope")


def test_a_stale_save_on_the_driver_path_writes_nothing(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as first, store.SqlAgentTurnStore(pg_url) as second:
        created = first.save(turn_with_history("t-1", 1), -1)
        second.load("t-1")
        winner = first.save(step(created), 0)
        with pytest.raises(VersionConflictError):
            second.save(step(created).model_copy(update={"steps": 42}), 0)
        assert first.load("t-1") == winner
        assert len(second.load("t-1").messages) == 2


def status_changed_at(url: str, turn_id: str) -> Any:
    engine = store.make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.select(turns_table.c.status_changed_at, turns_table.c.updated_at).where(turns_table.c.id == turn_id)
            ).one()
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite_url", "pg_url"])
def test_status_changed_at_moves_with_the_status_only_and_never_past_updated_at(
    database: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue(database))
    with store.SqlAgentTurnStore(url) as turns:
        turn = turns.save(turn_with_history("t-1", 1), -1)
        created_at = turn.updated_at
        assert tuple(status_changed_at(url, "t-1")) == (created_at, created_at)
        # A change of status moves it to the save's updated_at
        later = created_at + timedelta(seconds=10)
        turn = turns.save(step(turn).model_copy(update={"updated_at": later}), turn.version)
        assert tuple(status_changed_at(url, "t-1")) == (later, later)
        # Saves that keep the status leave it where it was
        for seconds in (20, 30):
            turn = turns.save(
                step(turn).model_copy(update={"updated_at": created_at + timedelta(seconds=seconds)}), turn.version
            )
        assert tuple(status_changed_at(url, "t-1")) == (later, created_at + timedelta(seconds=30))
        # A save dated before it (a clock that went back) brings it down to that date
        earlier = created_at - timedelta(seconds=5)
        turns.save(step(turn).model_copy(update={"updated_at": earlier}), turn.version)
        assert tuple(status_changed_at(url, "t-1")) == (earlier, earlier)
        # And the sweeps, which narrow by it, still find the turn by its last save
        assert [r.turn_id for r in turns.list_idle([AgentTurnStatus.RUNNING], created_at)] == ["t-1"]
        assert turns.list_idle([AgentTurnStatus.RUNNING], earlier) == []


def test_turns_in_every_status_are_found_idle_by_their_last_save(pg_url: str) -> None:
    base = AgentTurn(id="x", agent_id="a").updated_at
    with store.SqlAgentTurnStore(pg_url) as turns:
        for index, status in enumerate(
            [AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_APPROVAL, AgentTurnStatus.RUNNING]
        ):
            turn = turn_with_history(f"t-{index}", 1).model_copy(
                update={"status": status, "updated_at": base - timedelta(hours=index + 1)}
            )
            saved = turns.save(turn, -1)
            # A save hours later that keeps the status: idle only since then
            turns.save(saved.model_copy(update={"updated_at": base - timedelta(minutes=index + 1)}), 0)
        statuses = [AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_APPROVAL, AgentTurnStatus.RUNNING]
        assert turns.list_idle(statuses, base - timedelta(minutes=30)) == []
        assert [r.turn_id for r in turns.list_idle(statuses, base)] == ["t-2", "t-1", "t-0"]


def test_a_backend_killed_inside_a_single_statement_create_leaves_no_turn(
    pg_url: str, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    started = AgentEvent(event_id="t-1:0:0", type=AgentEventType.TURN_STARTED, turn_id="t-1", root_turn_id="t-1")
    with store.SqlAgentTurnStore(pg_url) as turns, psycopg.connect(libpq_url(pg_url)) as blocker:
        # Given another transaction that inserted the creation's event id and has not committed,
        # so the create statement, its header and message already written, waits on that row
        blocker.execute(
            "INSERT INTO agent_turn_events (event_id, turn_id, root_turn_id, type, created_at, payload, root_position)"
            " VALUES ('t-1:0:0', 't-1', 't-1', 'TURN_STARTED', now(), '{}', 1000)"
        )

        # When its backend is killed in the middle of the statement
        outcome = killed_mid_statement(admin, lambda: turns.save(turn_with_history("t-1", 2), -1, [started]), "create")
        blocker.rollback()
        # Then the create failed as unavailable, and nothing of it was written
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError)
        with pytest.raises(TurnNotFound):
            turns.load("t-1")
        # And the same create succeeds on retry, with its event
        assert turns.save(turn_with_history("t-1", 2), -1, [started]).version == 0
        assert [e.event_id for e in turns.read_events(EventScope.tree("t-1"))] == ["t-1:0:0"]


def open_connections(admin: psycopg.Connection[tuple[Any, ...]], application: str) -> int:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application]).fetchone()
    assert row is not None
    return int(row[0])


def test_connections_kept_for_the_driver_go_back_when_the_engine_is_disposed_or_the_store_dropped(
    pg_url: str, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    application = f"direct-{uuid.uuid4().hex[:8]}"
    url = make_url(pg_url).update_query_dict({"application_name": application}).render_as_string(hide_password=False)
    engine = store.make_engine(url)
    try:
        turns = store.SqlAgentTurnStore(engine)
        turn = turns.save(turn_with_history("t-1", 1), -1)
        turn = turns.save(step(turn), turn.version)
        # When the engine is disposed of under the store, the store goes on with the new pool
        engine.dispose()
        turn = turns.save(step(turn), turn.version)
        assert turns.load("t-1") == turn
        # And when the store is dropped without being closed, its connections go back to the pool
        del turns
        gc.collect()
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    # Then nothing is left open on the server (the connection of the disposed pool was closed too)
    deadline = time.monotonic() + 10
    while open_connections(admin, application) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_connections(admin, application) == 0


def test_the_sql_lease_runs_its_statements_prepared_on_the_driver(pg_url: str) -> None:
    engine = store.make_engine(pg_url)
    try:
        lease = store.SqlTurnLease(engine)
        held = lease.acquire("t-1", "me", 10_000)
        assert held is not None
        assert lease.acquire("t-1", "other", 10_000) is None
        assert lease.renew(held, 10_000) and lease.release(held)
        assert not lease.release(held)
        taken = lease.acquire("t-1", "other", 10_000)
        assert taken is not None and taken.fence == held.fence + 1
        lease.close()
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        with engine.connect() as connection:
            prepared = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
    finally:
        engine.dispose()
    assert any(text.startswith("INSERT INTO agent_turn_leases") for text in prepared)
    assert sum(text.startswith("UPDATE agent_turn_leases") for text in prepared) == 2


def test_a_listing_of_turns_is_one_statement_with_the_turns_sqlalchemy_reads(
    pg_url: str, driver_statements: list[str]
) -> None:
    engine = store.make_engine(pg_url)
    try:
        turns = store.SqlAgentTurnStore(engine)
        # Given two conversations of two tenants, each with an ended turn and a newer one, one of them stepped
        for number in range(4):
            status = AgentTurnStatus.COMPLETED if number < 2 else AgentTurnStatus.READY
            turn = turn_with_history(f"t-{number}", number + 1).model_copy(
                update={"conversation_id": f"c-{number % 2}", "tenant_id": f"tenant-{number % 2}", "status": status}
            )
            saved = turns.save(turn, -1)
        turns.save(step(saved).model_copy(update={"updated_at": utcnow()}), saved.version)
        listings: list[dict[str, Any]] = [
            {"conversation_id": "c-1", "limit": 1},
            {"conversation_id": "c-0"},
            {"tenant_id": "tenant-1", "statuses": [AgentTurnStatus.RUNNING, AgentTurnStatus.COMPLETED]},
            {"statuses": [AgentTurnStatus.READY, AgentTurnStatus.COMPLETED]},
            {"limit": 3},
        ]
        # When they are listed on the driver path
        driver_statements.clear()
        direct = [turns.list_turns(**listing) for listing in listings]
        # Then each listing is one statement, prepared on the driver's connection (the pool's only one)
        assert len(driver_statements) == len(listings)
        turns.close()
        with engine.connect() as connection:
            prepared = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
        assert any(text.startswith("SELECT t.id") and "json_agg(m.payload" in text for text in prepared)
        # And it returns what the SQLAlchemy path reads (taken while a listener watches the engine)
        with recording(engine):
            through_sqlalchemy = [store.SqlAgentTurnStore(engine).list_turns(**listing) for listing in listings]
        assert direct == through_sqlalchemy
        assert [[t.id for t in listed] for listed in direct] == [
            ["t-3"],
            ["t-2", "t-0"],
            ["t-3", "t-1"],
            ["t-2", "t-1", "t-0"],
            ["t-3", "t-2", "t-1"],
        ]
        assert [len(t.messages) for t in direct[2]] == [5, 2]
    finally:
        engine.dispose()


def test_a_history_read_of_chat_memory_is_one_prepared_statement(pg_url: str, driver_statements: list[str]) -> None:
    engine = store.make_engine(pg_url)
    try:
        provider = store.SqlChatMemoryProvider(engine)
        memory = provider("c-1")
        card = AgentActionMessage(id="card", turn_id="t", action_id="a", tool_name="refund", summary="refund(1)")
        memory.append([UserMessage(id="m-0", content="hello"), card, AiMessage(id="m-1", content="hi")])
        driver_statements.clear()
        # When the history is read on the driver path, with and without page messages, and of an empty conversation
        reads: list[list[Any]] = [
            list(memory.get_model_messages(10)),
            memory.get_messages(2),
            provider("c-2").get_messages(5),
        ]
        # Then each read is one statement, and it reads what the SQLAlchemy path reads
        assert len(driver_statements) == 3
        assert [[m.id for m in read] for read in reads] == [["m-0", "m-1"], ["card", "m-1"], []]
        # Prepared on the driver's connection (the pool's only one)
        provider.close()
        with engine.connect() as connection:
            prepared = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
        assert any("json_agg(newest.payload" in text for text in prepared)
        # The SQLAlchemy path (taken while a listener watches the engine) reads the same
        with recording(engine):
            again = store.SqlChatMemoryProvider(engine)
            assert [
                list(again("c-1").get_model_messages(10)),
                again("c-1").get_messages(2),
                again("c-2").get_messages(5),
            ] == reads
    finally:
        engine.dispose()
