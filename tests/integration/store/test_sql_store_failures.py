"""Failures mid-save: a killed backend, a serialization failure, an unreachable server.

Each leaves no partial write, surfaces as the retryable `StoreUnavailableError` chained to
the driver's error, and never shows the database password.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url

from agent_runner import AgentTurn, AiMessage, InputLimitError, StoreUnavailableError, TurnNotFound, UserMessage
from agent_runner.persistence import EventScope
from store import Inbox, SqlAgentTurnStore, SqlChatMemoryProvider, SqlTurnLease
from tests.integration.store.store_kit import killed_mid_statement

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-Pa55word"


def with_password(url: str) -> str:
    # The test server trusts local connections, so any password is accepted and merely carried along.
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def make_turn(turn_id: str) -> AgentTurn:
    return AgentTurn(
        id=turn_id, agent_id="a", root_turn_id=turn_id, conversation_id="c-1", messages=[UserMessage(content="hi")]
    )


def grow(turn: AgentTurn) -> AgentTurn:
    return turn.model_copy(update={"messages": [*turn.messages, AiMessage(content="step")], "steps": turn.steps + 1})


Hook = Callable[[Connection, Any, str, Any, Any, bool], None]


def terminate_before(admin: psycopg.Connection[tuple[Any, ...]], prefix: str, fired: list[int]) -> Hook:
    """A hook that kills the store's own backend from another connection just before `prefix` runs.

    The transaction is open at that point (the header was already written), so the kill
    lands mid-save, like a crash of the database server or a cut network.
    """

    def hook(connection: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if fired or not statement.startswith(prefix):
            return
        pid = connection.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(500):
            if admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() is None:
                break
            time.sleep(0.01)
        fired.append(pid)

    return hook


def test_a_backend_killed_mid_transaction_leaves_the_old_snapshot_and_a_retry_succeeds(
    pg_url: str, admin: psycopg.Connection[tuple[Any, ...]], caplog: pytest.LogCaptureFixture
) -> None:
    url = with_password(pg_url)
    with SqlAgentTurnStore(url) as first:
        created = first.save(make_turn("t-1"), -1)
    # A store that has not seen the turn saves in a transaction: SELECT, UPDATE, INSERT
    with SqlAgentTurnStore(url) as turns:
        fired: list[int] = []
        hook = terminate_before(admin, "INSERT INTO agent_turn_messages", fired)
        event.listen(turns.engine, "before_cursor_execute", hook)
        # When the backend dies after the header UPDATE and before the message INSERT
        with caplog.at_level(logging.DEBUG), pytest.raises(StoreUnavailableError) as raised:
            turns.save(grow(created), 0)
        event.remove(turns.engine, "before_cursor_execute", hook)
        assert fired
        # Then the error is retryable, chained to the driver's, and shows no password
        assert raised.value.retryable is True
        assert isinstance(raised.value.__cause__, psycopg.OperationalError)
        assert "saving turn 't-1'" in str(raised.value)
        assert PASSWORD not in str(raised.value) and "***" in str(raised.value)
        assert PASSWORD not in caplog.text
        # And nothing of the failed save was written
        assert turns.load("t-1") == created
        # And the same save succeeds on retry, on a new connection
        retried = turns.save(grow(created), 0)
        assert retried.version == 1
        assert turns.load("t-1") == retried


def test_a_backend_killed_inside_a_single_statement_save_leaves_the_old_snapshot(
    pg_url: str, postgres_url: str, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    with SqlAgentTurnStore(pg_url) as turns:
        created = turns.save(make_turn("t-1"), -1)
        libpq = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(libpq) as blocker:
            # Given another transaction holding the turn's row, so the save's statement waits inside the server
            blocker.execute("SELECT 1 FROM agent_turns WHERE id = 't-1' FOR UPDATE")

            # When its backend is killed in the middle of the statement
            outcome = killed_mid_statement(admin, lambda: turns.save(grow(created), 0), "save")
            blocker.rollback()
        # Then the save failed as unavailable, and nothing was written
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError)
        assert turns.load("t-1") == created
        assert turns.save(grow(created), 0).version == 1


def test_a_backend_killed_mid_create_leaves_no_turn_and_a_retry_succeeds(
    pg_url: str, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    with SqlAgentTurnStore(pg_url) as turns:
        fired: list[int] = []
        hook = terminate_before(admin, "INSERT INTO agent_turn_messages", fired)
        event.listen(turns.engine, "before_cursor_execute", hook)
        with pytest.raises(StoreUnavailableError):
            turns.save(make_turn("t-1"), -1)
        event.remove(turns.engine, "before_cursor_execute", hook)
        with pytest.raises(TurnNotFound):
            turns.load("t-1")
        # The conversation is not left busy by a half-created turn either
        assert turns.find_active_turn("c-1") is None
        assert turns.save(make_turn("t-1"), -1).version == 0


def test_a_serialization_failure_mid_save_is_retryable_and_writes_nothing(pg_url: str) -> None:
    with SqlAgentTurnStore(pg_url) as first:
        created = first.save(make_turn("t-1"), -1)
    # A store that has not seen the turn saves in a transaction: SELECT, UPDATE, INSERT
    with SqlAgentTurnStore(pg_url) as turns:
        fired: list[str] = []

        def fail(conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> Any:
            # Swap the message INSERT for a statement the server answers with SQLSTATE 40001.
            if not fired and statement.startswith("INSERT INTO agent_turn_messages"):
                fired.append(statement)
                raising = "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$"
                return raising, {}
            return statement, parameters

        event.listen(turns.engine, "before_cursor_execute", fail, retval=True)
        with pytest.raises(StoreUnavailableError) as raised:
            turns.save(grow(created), 0)
        event.remove(turns.engine, "before_cursor_execute", fail)
        assert fired
        assert isinstance(raised.value.__cause__, psycopg.errors.SerializationFailure)
        assert turns.load("t-1") == created
        assert turns.save(grow(created), 0).version == 1


def test_an_unreachable_server_is_unavailable_and_the_password_stays_hidden(postgres_url: str) -> None:
    # Port 9 (discard) refuses connections on the test machine.
    url = make_url(with_password(postgres_url)).set(port=9).render_as_string(hide_password=False)
    turns = SqlAgentTurnStore(url)
    memories = SqlChatMemoryProvider(url)
    inbox = Inbox(url)
    lease = SqlTurnLease(url)
    try:
        attempts: list[Callable[[], object]] = [
            lambda: turns.load("t-1"),
            lambda: turns.save(make_turn("t-1"), -1),
            lambda: memories("c-1").get_messages(10),
            lambda: inbox.enqueue("c-1", "m-1", "hi"),
            lambda: lease.acquire("t-1", "me", 1000),
        ]
        for attempt in attempts:
            with pytest.raises(StoreUnavailableError) as raised:
                attempt()
            assert PASSWORD not in str(raised.value)
            assert ":***@" in str(raised.value)
        for backend in (turns, memories, inbox, lease):
            assert PASSWORD not in repr(backend)
    finally:
        for closable in (turns, memories, inbox, lease):
            closable.close()


UNSTORABLE_IDS = [pytest.param("t\x00", id="nul"), pytest.param("t\ud800", id="lone-surrogate")]


@pytest.mark.parametrize("bad_id", UNSTORABLE_IDS)
def test_an_id_no_database_can_hold_is_a_typed_input_error_from_every_read(sql_url: str, bad_id: str) -> None:
    with SqlAgentTurnStore(sql_url) as turns, Inbox(sql_url) as inbox:
        reads: list[Callable[[], Any]] = [
            lambda: turns.load(bad_id),
            lambda: turns.get_ref(bad_id),
            lambda: turns.request_cancel(bad_id),
            lambda: turns.find_active_turn(bad_id),
            lambda: turns.list_turns(conversation_id=bad_id),
            lambda: turns.read_events(EventScope.conversation(bad_id)),
            lambda: turns.read_events(EventScope.tree(bad_id)),
            lambda: inbox.get(bad_id),
        ]
        # SQLite keeps NUL characters in text, so only a lookup that finds nothing happens there
        refused = bad_id != "t\x00" or sql_url.startswith("postgresql")
        for read in reads:
            if not refused:
                try:
                    assert not read()
                except TurnNotFound:
                    pass
                continue
            # Then each raises InputLimitError (InvalidTextError for a lone surrogate), never a driver's error
            with pytest.raises(InputLimitError) as raised:
                read()
            assert "refused" in str(raised.value) or "cannot be stored" in str(raised.value)
