"""Migrations: the migrated schema is the models' schema, upgrades are repeatable, SQLite migrates itself."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection

import store
from agent_runner import AgentTurn, AgentTurnStatus
from agent_runner.persistence import ConversationKey, EventScope
from store.migrations import current_revision, head_revision
from store.schema import VERSION_TABLE, metadata
from tests.integration.store.migration_kit import migrated_to, schema_differences

ALL_TABLES = {table.name for table in metadata.sorted_tables}

EMPTY_DATABASES = pytest.mark.parametrize(
    "database",
    [
        pytest.param("sqlite_url", id="sqlite"),
        pytest.param("empty_pg_url", id="postgres", marks=pytest.mark.integration),
    ],
)
"""Runs a test on an empty SQLite file and on an empty PostgreSQL schema (the fixture named by `database`)."""


def table_names(url: str) -> set[str]:
    engine = store.make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@EMPTY_DATABASES
def test_the_migrated_schema_equals_the_models(database: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue(database))
    # Given an empty database, when it is migrated (twice: the second run is a no-op)
    store.migrate(url)
    store.migrate(url)
    # Then Alembic finds nothing to change between it and the models
    assert schema_differences(url) == []
    assert table_names(url) == ALL_TABLES | {VERSION_TABLE}
    engine = store.make_engine(url)
    try:
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision() == "0011"
        # And the partial unique index covers exactly the non-terminal statuses
        index = next(
            i
            for i in sa.inspect(engine).get_indexes("agent_turns")
            if i["name"] == "ix_agent_turns_active_conversation"
        )
        assert index["unique"]
        predicate = str(index["dialect_options"][f"{engine.dialect.name}_where"])
        for status in AgentTurnStatus:
            assert (f"'{status.value}'" in predicate) is (not status.is_terminal)
    finally:
        engine.dispose()


def test_the_embedded_sqlite_database_migrates_itself_on_first_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    # Given no database file at all, when a store opens it
    with store.SqlAgentTurnStore(url) as turns:
        turns.save(AgentTurn(id="t-1", agent_id="a", root_turn_id="t-1"), -1)
    # Then every table exists at the newest revision, and the other backends open it as is
    assert table_names(url) == ALL_TABLES | {VERSION_TABLE}
    assert schema_differences(url) == []
    with store.Inbox(url) as inbox, store.SqlTurnLease(url) as lease, store.SqlChatMemoryProvider(url) as memories:
        assert inbox.conversations_ready() == []
        assert lease.acquire("t-1", "me", 1000) is not None
        assert memories("c").get_messages(5) == []
    with store.SqlAgentTurnStore(url) as turns:
        assert turns.load("t-1").version == 0


def test_concurrent_first_use_of_an_embedded_database_migrates_it_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            store.SqlAgentTurnStore(url).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert schema_differences(url) == []


FIRST_USE_SCRIPT = """
import sys
from workers.database import open_database
print("ready", flush=True)
sys.stdin.readline()
open_database(sys.argv[1]).close()
"""


def test_processes_opening_a_new_database_file_together_all_start(tmp_path: Path) -> None:
    # Given a new SQLite file whose creator still holds its write lock, in its first
    # (rollback) journal mode, as the process that creates a new file does for a moment
    path = tmp_path / "together.db"
    creator = sqlite3.connect(path, isolation_level=None)
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE creating (x)")
    # When several processes open it at the same moment, while the lock is held
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE_SCRIPT, f"sqlite:///{path}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    time.sleep(1.5)
    creator.execute("ROLLBACK")  # it wrote nothing the migration must know about
    creator.close()
    # Then each waits for the lock instead of failing with "database is locked", and the
    # database ends up migrated once, in WAL mode
    outcomes = [(p.wait(timeout=60), p.communicate(timeout=60)[1]) for p in processes]
    assert [stderr for code, stderr in outcomes if code != 0] == []
    assert schema_differences(f"sqlite:///{path}") == []
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        check.close()


@pytest.mark.integration
def test_a_postgresql_database_is_not_migrated_behind_the_operators_back(empty_pg_url: str) -> None:
    with store.SqlAgentTurnStore(empty_pg_url):
        pass
    assert table_names(empty_pg_url) == set()


@pytest.mark.integration
def test_worker_queries_use_indexes(pg_url: str) -> None:
    """With sequential scans priced out, no hot query falls back to scanning agent_turns."""
    captured: list[tuple[str, Any]] = []

    def capture(conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    from datetime import UTC, datetime

    now = datetime.now(UTC)
    with store.SqlAgentTurnStore(pg_url) as turns, store.Inbox(pg_url) as inbox:
        event.listen(turns.engine, "before_cursor_execute", capture)
        event.listen(inbox.engine, "before_cursor_execute", capture)
        turns.find_active_turn("c-1")
        turns.list_runnable(now)
        turns.list_idle([AgentTurnStatus.RUNNING], now)
        turns.list_turns(conversation_id="c-1")
        turns.list_turns(parent_turn_id="p-1")
        turns.list_turns(statuses=[AgentTurnStatus.RUNNING])
        inbox.conversations_ready()
        inbox.claim_next(ConversationKey("c-1"))
        with turns.engine.connect() as connection:
            connection.exec_driver_sql("SET enable_seqscan = off")
            plans = {
                statement: "\n".join(row[0] for row in connection.exec_driver_sql("EXPLAIN " + statement, parameters))
                for statement, parameters in captured
            }
    assert len(plans) >= 8
    scanning = {statement: plan for statement, plan in plans.items() if "Seq Scan on agent_turns" in plan}
    assert scanning == {}


@EMPTY_DATABASES
def test_upgrading_from_0001_moves_the_tenant_from_the_state_into_its_column(
    database: str, request: pytest.FixtureRequest
) -> None:
    import json

    from store._engine import writer

    url = str(request.getfixturevalue(database))
    engine = store.make_engine(url)
    try:
        # Given a database at revision 0001 holding turns saved then, the tenant inside the state JSON
        migrated_to(engine, "0001")
        header_columns = {c.name for c in metadata.tables["agent_turns"].columns} - {"state", "tenant_id"}
        with writer(engine).begin() as connection:
            for turn_id, tenant in (("t-1", "tenant-a"), ("t-2", None)):
                turn = AgentTurn(id=turn_id, agent_id="a", tenant_id=tenant, version=0)
                state = turn.model_dump(mode="json", exclude=header_columns | {"messages"})
                assert state["tenant_id"] == tenant
                connection.execute(
                    sa.text(
                        "INSERT INTO agent_turns (id, agent_id, agent_version, root_turn_id, status, phase, version,"
                        " message_count, cancel_requested, created_at, updated_at, state) VALUES (:id, 'a', '1', :id,"
                        " 'COMPLETED', 'MODEL', 0, 0, false, :now, :now, :state)"
                    ),
                    {"id": turn_id, "now": turn.created_at, "state": json.dumps(state)},
                )
        # When it is upgraded to the newest revision
        store.migrate(url)
    finally:
        engine.dispose()
    # Then the tenant is in its column, the snapshots load as before, and the schema is current
    with store.SqlAgentTurnStore(url) as turns:
        assert turns.load("t-1").tenant_id == "tenant-a"
        assert turns.load("t-2").tenant_id is None
        with turns.engine.connect() as connection:
            stored: dict[str, str | None] = {
                row[0]: row[1] for row in connection.execute(sa.text("SELECT id, tenant_id FROM agent_turns"))
            }
        # (no tenant is "" in the column since 0012: it keys conversations with their id)
        assert stored == {"t-1": "tenant-a", "t-2": ""}
    assert schema_differences(url) == []


@EMPTY_DATABASES
def test_upgrading_from_0005_numbers_stored_events_in_their_read_order_and_old_cursors_keep_working(
    database: str, request: pytest.FixtureRequest
) -> None:
    from agent_runner import AgentEvent, AgentEventType
    from store._engine import writer

    url = str(request.getfixturevalue(database))
    postgres = url.startswith("postgresql")
    # Given events stored at revision 0005, read then in (transaction id, id) order; SQLite
    # wrote transaction id 0, PostgreSQL the writer's (so there id order is not read order)
    stored = [  # id, xid, event id, root, conversation
        (1, 200, "r-1:1:0", "r-1", "c-1"),
        (2, 100, "r-1:0:0", "r-1", "c-1"),
        (3, 100, "r-2:0:0", "r-2", "c-1"),
        (4, 300, "r-1:2:0", "r-1", None),
    ]
    engine = store.make_engine(url)
    try:
        migrated_to(engine, "0005")
        with writer(engine).begin() as connection:
            for root in ("r-1", "r-2"):
                connection.execute(
                    sa.text(
                        "INSERT INTO agent_turns (id, agent_id, agent_version, conversation_id, root_turn_id, status,"
                        " phase, version, message_count, cancel_requested, created_at, updated_at, state,"
                        " status_changed_at) VALUES (:id, 'a', '1', :conversation, :id, 'RUNNING', 'MODEL', 0, 0,"
                        " false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, '{}', CURRENT_TIMESTAMP)"
                    ),
                    {"id": root, "conversation": "c-1" if root == "r-1" else None},
                )
            for row_id, xid, event_id, root, conversation in stored:
                payload = AgentEvent(
                    event_id=event_id,
                    type=AgentEventType.TURN_STARTED,
                    turn_id=root,
                    root_turn_id=root,
                    conversation_id=conversation,
                ).model_dump_json()
                inserted = connection.execute(
                    sa.text(
                        "INSERT INTO agent_turn_events (xid, event_id, turn_id, root_turn_id, conversation_id,"
                        " type, created_at, payload) VALUES (:xid, :event_id, :root, :root, :conversation,"
                        " 'TURN_STARTED', CURRENT_TIMESTAMP, :payload) RETURNING id"
                    ),
                    {
                        "xid": xid if postgres else 0,
                        "event_id": event_id,
                        "root": root,
                        "conversation": conversation,
                        "payload": payload,
                    },
                ).scalar_one()
                assert inserted == row_id  # ids as listed: the table was empty
        # When it is upgraded to the newest revision
        store.migrate(url)
    finally:
        engine.dispose()
    assert schema_differences(url) == []
    in_order = sorted(stored, key=lambda row: (row[1] if postgres else 0, row[0]))
    old_cursor = {row[2]: f"{row[1] if postgres else 0}.{row[0]}" for row in stored}
    tree = [row[2] for row in in_order if row[3] == "r-1"]
    in_conversation = [row[2] for row in in_order if row[4] == "c-1"]
    with store.SqlAgentTurnStore(url) as turns:
        # Then the log reads in the same order as before, now with positions for cursors
        assert [e.event_id for e in turns.read_events(EventScope.tree("r-1"))] == tree
        assert [e.event_id for e in turns.read_events(EventScope.conversation("c-1"))] == in_conversation
        assert [e.cursor for e in turns.read_events(EventScope.tree("r-1"))] == ["1", "2", "3"]
        # And a cursor issued before the upgrade resumes after its event
        for index, event_id in enumerate(tree):
            after = turns.read_events(EventScope.tree("r-1"), after=old_cursor[event_id])
            assert [e.event_id for e in after] == tree[index + 1 :]
        for index, event_id in enumerate(in_conversation):
            after = turns.read_events(EventScope.conversation("c-1"), after=old_cursor[event_id])
            assert [e.event_id for e in after] == in_conversation[index + 1 :]
        # And events saved after the upgrade follow the stored ones, also after an old cursor
        ended = AgentTurn(id="r-1", agent_id="a", conversation_id="c-1", status=AgentTurnStatus.COMPLETED)
        added = AgentEvent(event_id="r-1:3:0", type=AgentEventType.TURN_COMPLETED, turn_id="r-1")
        turns.save(ended, 0, [added])
        assert [e.event_id for e in turns.read_events(EventScope.tree("r-1"), after=old_cursor[tree[-1]])] == [
            "r-1:3:0"
        ]
        assert [e.cursor for e in turns.read_events(EventScope.tree("r-1"), after="3")] == ["4"]
        last_in_conversation = turns.read_events(EventScope.conversation("c-1"), after=old_cursor[in_conversation[-1]])
        assert [(e.event_id, e.cursor) for e in last_in_conversation] == [("r-1:3:0", "4")]
    if not postgres:
        # SQLite rebuilt the table and kept AUTOINCREMENT, so pruned ids are never handed out again
        engine = store.make_engine(url)
        try:
            with engine.connect() as connection:
                created = connection.execute(
                    sa.text("SELECT sql FROM sqlite_master WHERE name = 'agent_turn_events'")
                ).scalar_one()
        finally:
            engine.dispose()
        assert "AUTOINCREMENT" in created
