"""Fixtures for the event tests: Celery worker processes on real PostgreSQL and Redis, per test.

Each deployment works in a PostgreSQL schema and under a Redis key prefix of its own; every
worker and follower process a test started is stopped afterwards, whatever happened.
Services that do not answer fail the test; nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.celery_events.event_cluster import event_cluster
from tests.integration.celery_workers.celery_cluster import Cluster


@pytest.fixture
def cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with event_cluster(postgres_url, tmp_path) as deployment:
        yield deployment
