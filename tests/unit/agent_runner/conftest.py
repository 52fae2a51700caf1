"""Checks and fixtures shared by the agent_runner unit tests (the hostile-input deployments among them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from tests.helpers.hostile import TEST_REDIS_URL, Deployment, deployed
from tests.unit.agent_runner.turn_kit import MISSHAPEN_EVENTS


@pytest.fixture(autouse=True)
def _events_have_their_payload_shape() -> Iterator[None]:
    """Fail a test in which an `EventLog` received an event whose data does not fit its type's payload model."""
    MISSHAPEN_EVENTS.clear()
    yield
    found = list(MISSHAPEN_EVENTS)
    MISSHAPEN_EVENTS.clear()
    assert not found, f"events that do not fit their payload model: {found}"


@pytest.fixture
def redis_client() -> Iterator[Redis[bytes]]:
    client: Redis[bytes] = Redis.from_url(TEST_REDIS_URL, socket_timeout=5)
    try:
        client.ping()  # an unreachable server fails the test
        yield client
    finally:
        client.close()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Embedded mode: SQLite, no Redis."""
    with deployed(f"sqlite:///{tmp_path / 'hostile.db'}") as embedded:
        yield embedded


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One embedded deployment shared by the refusal cases: each checks that it changed nothing."""
    with deployed(f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'hostile.db'}") as embedded:
        yield embedded


@pytest.fixture
def pg_deployment(pg_url: str, redis_client: Redis[bytes]) -> Iterator[Deployment]:
    """Distributed mode: PostgreSQL and the Redis conversation guard."""
    with deployed(pg_url, redis_client) as distributed:
        yield distributed


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def any_deployment(request: pytest.FixtureRequest) -> Deployment:
    """Both modes, for the cases that are not run one by one on PostgreSQL."""
    fixture = "deployment" if request.param == "sqlite" else "pg_deployment"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]
