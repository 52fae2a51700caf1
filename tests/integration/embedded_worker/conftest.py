"""Fixtures for the embedded worker tests: real PostgreSQL and Redis, SQLite files, worker processes.

PostgreSQL is the server at `AGENT_RUNNER_TEST_DATABASE_URL`, possibly shared with other
suites running at the same time: each test works in a schema of its own (selected with
`search_path` in the URL, so worker processes only need the URL) and drops it afterwards.
Redis is the server at `AGENT_RUNNER_TEST_REDIS_URL`; each test uses a key prefix of its
own and deletes exactly those keys afterwards. Only the Redis flush test empties a
database, and it uses a dedicated database number for that. Unreachable services fail the
tests; they never skip them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis import Redis
from redis.exceptions import RedisError

from store.keys import RedisKeys
from store.redaction import redact_url

FLUSH_DB = int(os.environ.get("AGENT_RUNNER_TEST_REDIS_FLUSH_DB", "14"))
"""The Redis database number the flush test may empty; no other test uses it."""


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A URL of a new SQLite file (the stores create and migrate it on first use)."""
    return f"sqlite:///{tmp_path / 'agent_runner.db'}"


def _check_redis(url: str) -> None:
    client: Redis[Any] = Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except RedisError as exc:
        pytest.fail(f"Redis at {redact_url(url)} is unreachable ({type(exc).__name__}: {exc}); start it first")
    finally:
        client.close()


def delete_namespace(url: str, keys: RedisKeys) -> None:
    client: Redis[Any] = Redis.from_url(url, socket_timeout=5)
    try:
        found = list(client.scan_iter(match=keys.pattern(), count=1000))
        if found:
            client.delete(*found)
    finally:
        client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key namespace of this test alone on the shared test database; its keys are deleted afterwards."""
    keys = RedisKeys(f"agent-runner-worker-test-{uuid.uuid4().hex}")
    try:
        yield keys.prefix
    finally:
        delete_namespace(redis_url, keys)


@pytest.fixture
def flush_redis_url(redis_url: str) -> str:
    """The same Redis server, on the database number reserved for the flush test."""
    parts = urlsplit(redis_url)
    if int(parts.path.strip("/") or "0") == FLUSH_DB:
        pytest.fail(f"AGENT_RUNNER_TEST_REDIS_URL uses database {FLUSH_DB}, which the flush test empties")
    flush_url = urlunsplit(parts._replace(path=f"/{FLUSH_DB}"))
    _check_redis(flush_url)
    return flush_url


@pytest.fixture
def flush_prefix(flush_redis_url: str) -> Iterator[str]:
    """A key namespace of this test alone on the flush database; its keys are deleted afterwards."""
    keys = RedisKeys(f"agent-runner-flush-test-{uuid.uuid4().hex}")
    try:
        yield keys.prefix
    finally:
        delete_namespace(flush_redis_url, keys)
