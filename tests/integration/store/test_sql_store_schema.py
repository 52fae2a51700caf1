"""Migrations: the migrated schema is the models' schema, upgrades are repeatable, SQLite migrates itself."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event
from sqlalchemy.engine import Connection

import store
from agent_runner import AgentTurn, AgentTurnStatus
from store.migrations import current_revision, head_revision
from store.schema import VERSION_TABLE, metadata

ALL_TABLES = {table.name for table in metadata.sorted_tables}


def schema_differences(url: str) -> list[Any]:
    engine = store.make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    engine = store.make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "database",
    [
        pytest.param("sqlite_url", id="sqlite"),
        pytest.param("empty_pg_url", id="postgres", marks=pytest.mark.integration),
    ],
)
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
            assert current_revision(connection) == head_revision() == "0009"
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
        turns.list_stale_running(now)
        turns.list_turns(conversation_id="c-1")
        turns.list_turns(parent_turn_id="p-1")
        turns.list_turns(statuses=[AgentTurnStatus.RUNNING])
        inbox.conversations_ready()
        inbox.claim_next("c-1")
        with turns.engine.connect() as connection:
            connection.exec_driver_sql("SET enable_seqscan = off")
            plans = {
                statement: "\n".join(row[0] for row in connection.exec_driver_sql("EXPLAIN " + statement, parameters))
                for statement, parameters in captured
            }
    assert len(plans) >= 8
    scanning = {statement: plan for statement, plan in plans.items() if "Seq Scan on agent_turns" in plan}
    assert scanning == {}


@pytest.mark.parametrize(
    "database",
    [
        pytest.param("sqlite_url", id="sqlite"),
        pytest.param("empty_pg_url", id="postgres", marks=pytest.mark.integration),
    ],
)
def test_upgrading_from_0001_moves_the_tenant_from_the_state_into_its_column(
    database: str, request: pytest.FixtureRequest
) -> None:
    import json

    from alembic import command

    from store._engine import writer
    from store.migrations import alembic_config

    url = str(request.getfixturevalue(database))
    engine = store.make_engine(url)
    try:
        # Given a database at revision 0001 holding turns saved then, the tenant inside the state JSON
        with writer(engine).begin() as connection:
            command.upgrade(alembic_config(connection), "0001")
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
        assert stored == {"t-1": "tenant-a", "t-2": None}
    assert schema_differences(url) == []
