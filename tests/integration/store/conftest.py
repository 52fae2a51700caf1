"""Fixtures for the SQL store integration tests: PostgreSQL schemas per test, SQLite files.

PostgreSQL is the server at `AGENT_RUNNER_TEST_DATABASE_URL`, possibly shared with other
suites running at the same time: each test works in a schema of its own (selected with
`search_path`, so child processes only need the URL) and drops it afterwards. An
unreachable server fails the tests; it never skips them.
"""

from __future__ import annotations

import pytest

from tests.conftest import NON_UTC_ZONE

SQL_DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]

ZONED_SQL_DATABASES = [
    *SQL_DATABASES,
    pytest.param("postgres-non-utc", id="postgres-non-utc", marks=pytest.mark.integration),
]
"""`SQL_DATABASES` and PostgreSQL in sessions whose time zone is not UTC, for a module's
`pytest.mark.parametrize("sql_url", ZONED_SQL_DATABASES, indirect=True)`."""


@pytest.fixture(params=SQL_DATABASES)
def sql_url(request: pytest.FixtureRequest) -> str:
    """Each SQL database in turn."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def pg_session_zone(pg_session_zone: str | None, request: pytest.FixtureRequest) -> str | None:
    callspec = getattr(request.node, "callspec", None)
    zoned = callspec is not None and callspec.params.get("sql_url") == "postgres-non-utc"
    return NON_UTC_ZONE if zoned else pg_session_zone
