"""Fixtures for the SQL store integration tests: PostgreSQL schemas per test, SQLite files.

PostgreSQL is the server at `AGENT_RUNNER_TEST_DATABASE_URL`, possibly shared with other
suites running at the same time: each test works in a schema of its own (selected with
`search_path`, so child processes only need the URL) and drops it afterwards. An
unreachable server fails the tests; it never skips them.
"""

from __future__ import annotations

import pytest


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def sql_url(request: pytest.FixtureRequest) -> str:
    """Each SQL database in turn."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))
