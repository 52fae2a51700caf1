"""Backends for the contract suites: every test runs against in-memory, SQLite and PostgreSQL.

PostgreSQL is the server at `AGENT_RUNNER_TEST_DATABASE_URL`. Each test gets a schema of
its own (selected with `search_path`), migrated with `store.migrate` and dropped afterwards,
so the suites can run repeatedly and beside other suites on the same server. An unreachable
server fails the PostgreSQL tests; it never skips them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

import store
from agent_runner import InMemoryAgentTurnStore, InMemoryChatMemoryProvider
from agent_runner.persistence import AgentTurnStore, ChatMemoryProvider

DEFAULT_TEST_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL; fails (never skips) when the server does not answer."""
    url = os.environ.get("AGENT_RUNNER_TEST_DATABASE_URL", DEFAULT_TEST_DATABASE_URL)
    try:
        with psycopg.connect(_libpq(url), connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        shown = make_url(url).render_as_string(hide_password=True)
        pytest.fail(f"PostgreSQL at {shown} is unreachable ({type(exc).__name__}); start it first")
    return url


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections work in a fresh, migrated schema of this test alone."""
    schema = f"agent_runner_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
        rendered = url.render_as_string(hide_password=False)
        store.migrate(rendered)
        yield rendered
    finally:
        with psycopg.connect(_libpq(postgres_url), autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | None:
    """The SQL backend's URL; None for the in-memory backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'agent_runner.db'}"
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_schema_url"))
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
