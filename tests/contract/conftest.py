"""Backends for the contract suites: every test runs against in-memory, SQLite and PostgreSQL.

PostgreSQL is the server at `AGENT_RUNNER_TEST_DATABASE_URL`. Each test gets a schema of
its own (selected with `search_path`), migrated with `store.migrate` and dropped afterwards,
so the suites can run repeatedly and beside other suites on the same server. An unreachable
server fails the PostgreSQL tests; it never skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import store
from agent_runner import InMemoryAgentTurnStore, InMemoryChatMemoryProvider
from agent_runner.persistence import AgentTurnStore, ChatMemoryProvider
from tests.conftest import NON_UTC_ZONE

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]

ZONED_BACKENDS = [
    *BACKENDS,
    pytest.param("postgres-non-utc", id="postgres-non-utc", marks=pytest.mark.integration),
]
"""`BACKENDS` and PostgreSQL in sessions whose time zone is not UTC, for the suites that store timestamps."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pg_session_zone(pg_session_zone: str | None, backend: str) -> str | None:
    return NON_UTC_ZONE if backend == "postgres-non-utc" else pg_session_zone


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | None:
    """The SQL backend's URL; None for the in-memory backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'agent_runner.db'}"
    if backend.startswith("postgres"):
        return str(request.getfixturevalue("pg_url"))
    return None


@pytest.fixture
def turn_store(database_url: str | None) -> Iterator[AgentTurnStore]:
    if database_url is None:
        yield InMemoryAgentTurnStore()
        return
    with store.SqlAgentTurnStore(database_url) as sql_store:
        yield sql_store


@pytest.fixture
def other_turn_store(turn_store: AgentTurnStore, database_url: str | None) -> Iterator[AgentTurnStore]:
    """A second store on the same data, as another process would have; the same one in memory."""
    if database_url is None:
        yield turn_store
        return
    with store.SqlAgentTurnStore(database_url) as sql_store:
        yield sql_store


@pytest.fixture
def chat_memory_provider(database_url: str | None) -> Iterator[ChatMemoryProvider]:
    if database_url is None:
        yield InMemoryChatMemoryProvider()
        return
    with store.SqlChatMemoryProvider(database_url) as provider:
        yield provider
