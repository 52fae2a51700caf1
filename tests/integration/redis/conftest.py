"""Fixtures for the Redis lease and guard tests: a real server, and a key namespace per test.

The server at `AGENT_RUNNER_TEST_REDIS_URL` may be shared with other suites running at the
same time, so tests never flush the database: each one works under its own key prefix and
deletes exactly those keys afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from store.keys import RedisKeys
from store.redaction import redact_url
from store.redis_guard import RedisConversationGuard
from store.redis_lease import RedisTurnLease

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test server's URL; fails (never skips) when the server does not answer."""
    url = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL)
    client: Redis[Any] = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    except RedisError as exc:
        pytest.fail(f"Redis at {redact_url(url)} is unreachable ({type(exc).__name__}: {exc}); start it first")
    finally:
        client.close()
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Redis[Any]]:
    """A plain client of the test server, for looking at and tampering with keys."""
    client: Redis[Any] = Redis.from_url(redis_url, socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def keys(redis_client: Redis[Any]) -> Iterator[RedisKeys]:
    """A key namespace of this test alone; its keys are deleted afterwards."""
    namespace = RedisKeys(f"agent-runner-test-{uuid.uuid4().hex}")
    try:
        yield namespace
    finally:
        delete_namespace(redis_client, namespace)


@pytest.fixture
def lose_redis_data(redis_client: Redis[Any], keys: RedisKeys) -> Callable[[], int]:
    """Deletes every key of the test's namespace, as a Redis restart without persistence would."""
    return lambda: delete_namespace(redis_client, keys)


def delete_namespace(client: Redis[Any], namespace: RedisKeys) -> int:
    found = list(client.scan_iter(match=namespace.pattern(), count=1000))
    return int(client.delete(*found)) if found else 0


@pytest.fixture
def lease(redis_url: str, keys: RedisKeys) -> Iterator[RedisTurnLease]:
    with RedisTurnLease(redis_url, prefix=keys.prefix) as turn_lease:
        yield turn_lease


@pytest.fixture
def guard(redis_url: str, keys: RedisKeys) -> Iterator[RedisConversationGuard]:
    with RedisConversationGuard(redis_url, prefix=keys.prefix) as conversation_guard:
        yield conversation_guard
