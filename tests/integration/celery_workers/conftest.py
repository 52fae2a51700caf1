"""Fixtures for the Celery worker tests: real worker processes on real PostgreSQL, Redis and RabbitMQ.

Each test gets its own PostgreSQL schema (through `search_path`), its own Redis key prefix
for leases, guard and broker keys, and its own queue, so tests never see each other's
messages or turns and can share the servers with other suites. Services that do not answer
fail the test; nothing is skipped. Every process a test started is stopped in a `finally`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import store
from tests.integration.celery_workers import chaos_agents
from tests.integration.celery_workers.celery_agents import dispose_ledger_engine, metadata
from tests.integration.celery_workers.celery_cluster import DEFAULT_DATABASE_URL, Cluster, clusters


@pytest.fixture(scope="session")
def database_url() -> str:
    url = os.environ.get("AGENT_RUNNER_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)
    engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        pytest.fail(f"PostgreSQL at {sa.make_url(url).render_as_string()} is unreachable: {exc}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def schema_url(database_url: str) -> Iterator[str]:
    """A migrated PostgreSQL schema of this test alone (with the ledger tables of the test agents); dropped afterwards."""
    schema = f"w_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(database_url)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = url.render_as_string(hide_password=False)
    try:
        store.migrate(rendered)
        engine = sa.create_engine(rendered)
        metadata.create_all(engine)
        chaos_agents.metadata.create_all(engine)
        engine.dispose()
        yield rendered
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def make_cluster(schema_url: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Builds the test's cluster; every process it started is stopped afterwards, whatever happened."""
    try:
        with clusters(schema_url, redis_url, tmp_path) as make:
            yield make
    finally:
        dispose_ledger_engine()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()
