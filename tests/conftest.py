"""Shared test configuration and service fixtures.

Service URLs come from the environment (`AGENT_RUNNER_TEST_DATABASE_URL`,
`AGENT_RUNNER_TEST_REDIS_URL`). PostgreSQL may be shared with other suites running at the
same time: each test works in a schema of its own (selected with `search_path`, so child
processes only need the URL) and drops it afterwards. An unreachable server fails the
tests that need it; it never skips them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.engine import make_url

import store
from store.redaction import redact_url
from tests.helpers.celery_fleet import keep_logs

TEST_DATABASE_URL = os.environ.get(
    "AGENT_RUNNER_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TEST_REDIS_URL = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
NON_UTC_ZONE = "America/Sao_Paulo"
"""A session time zone other than UTC (and than the server's default), for the zone variants of the PostgreSQL tests."""


_FAILED = pytest.StashKey[bool]()
_TMP_PATH = pytest.StashKey[Path]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the process logs of a failed test (they are in its `tmp_path`) once its processes were stopped."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", None) or {}
    if isinstance(funcargs.get("tmp_path"), Path):
        item.stash[_TMP_PATH] = funcargs["tmp_path"]
    if report.failed:
        item.stash[_FAILED] = True
    if report.when == "teardown" and item.stash.get(_FAILED, False) and _TMP_PATH in item.stash:
        kept = keep_logs(item.stash[_TMP_PATH], item.nodeid)
        if kept is not None:
            report.sections.append(("process logs", f"kept in {kept}"))
    return report


@pytest.fixture(autouse=True)
def _no_real_model_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never talk to a hosted model: an accidental real call fails for lack of a key.
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _an_operator_is_logged_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # CLI decisions are recorded as taken by $USER and refused without one; containers and
    # CI runners often have none, so the tests give one (the tests of the refusal remove it).
    if not os.environ.get("USER"):
        monkeypatch.setenv("USER", "test-operator")


def libpq_url(url: str) -> str:
    """The same server as a plain libpq URL, for psycopg connections made by the tests."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL; fails (never skips) when the server does not answer."""
    try:
        with psycopg.connect(libpq_url(TEST_DATABASE_URL), connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        shown = make_url(TEST_DATABASE_URL).render_as_string(hide_password=True)
        pytest.fail(f"PostgreSQL at {shown} is unreachable ({type(exc).__name__}); start it first")
    return TEST_DATABASE_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis server's URL; fails (never skips) when the server does not answer.

    Tests share its database: each works under a key prefix of its own and deletes exactly
    those keys afterwards, never the whole database.
    """
    client: Redis[Any] = Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except RedisError as exc:
        pytest.fail(
            f"Redis at {redact_url(TEST_REDIS_URL)} is unreachable ({type(exc).__name__}: {exc}); start it first"
        )
    finally:
        client.close()
    return TEST_REDIS_URL


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test server, outside any store."""
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as connection:
        yield connection


@pytest.fixture
def pg_session_zone() -> str | None:
    """The time zone of the test's PostgreSQL sessions (None: the server's default).

    `AGENT_RUNNER_TEST_PG_TIMEZONE` sets it for a whole run; a test or a fixture variant
    overrides it (see `NON_UTC_ZONE`) to prove the stores' timestamps do not depend on it.
    """
    return os.environ.get("AGENT_RUNNER_TEST_PG_TIMEZONE") or None


@pytest.fixture
def empty_pg_url(postgres_url: str, pg_session_zone: str | None) -> Iterator[str]:
    """A URL whose connections work in a fresh, empty schema of this test alone (and in `pg_session_zone`)."""
    schema = f"agent_runner_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        options = f"-csearch_path={schema}"
        if pg_session_zone is not None:
            options += f" -ctimezone={pg_session_zone}"
        url = make_url(postgres_url).update_query_dict({"options": options})
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq_url(postgres_url), autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_url(empty_pg_url: str) -> str:
    """A URL of a fresh schema migrated to the newest revision."""
    store.migrate(empty_pg_url)
    return empty_pg_url


@pytest.fixture
def driver_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts of the statements every psycopg cursor runs from now on, whoever runs them."""
    texts: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, query: Any, params: Any = None, **options: Any) -> Any:
        texts.append(query if isinstance(query, str) else str(query))
        return execute(cursor, query, params, **options)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return texts


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A URL of a new SQLite file (the stores migrate it on first use)."""
    return f"sqlite:///{tmp_path / 'agent_runner.db'}"
