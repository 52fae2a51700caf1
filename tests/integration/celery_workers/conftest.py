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
from typing import Any

import pytest
import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError

import store
from tests.integration.celery_workers.celery_agents import dispose_ledger_engine, metadata
from tests.integration.celery_workers.celery_cluster import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    Cluster,
    cluster_env,
    delete_amqp_queue,
    delete_prefix,
)


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


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    client: Redis[Any] = Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except RedisError as exc:
        pytest.fail(f"Redis at {url} is unreachable: {exc}")
    finally:
        client.close()
    return url


@pytest.fixture
def schema_url(database_url: str) -> Iterator[str]:
    """A migrated PostgreSQL schema of this test alone (with the ledger tables); dropped afterwards."""
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
        engine.dispose()
        yield rendered
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def make_cluster(schema_url: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Builds the test's cluster; every process it started is stopped afterwards, whatever happened."""
    namespace = f"ar-test-{uuid.uuid4().hex[:10]}"
    clusters: list[Cluster] = []

    def make(broker_url: str | None = None, **overrides: str) -> Cluster:
        env = cluster_env(
            schema_url=schema_url, redis_url=redis_url, namespace=namespace, broker_url=broker_url, **overrides
        )
        cluster = Cluster(env=env, tmp_path=tmp_path, redis_url=redis_url)
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            try:
                cluster.stop_all()
            finally:
                if cluster.settings.broker_url.startswith("amqp"):
                    delete_amqp_queue(cluster)
                cluster.close()
        dispose_ledger_engine()
        delete_prefix(redis_url, namespace)


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()
