"""Fixtures of the parity tests: every test runs once on each execution path.

The embedded path needs PostgreSQL only; the Celery path needs PostgreSQL and Redis. Each
run gets a fresh migrated schema (`pg_url`), a Redis key namespace and queue of its own
(Celery), and a signals folder; every worker process it started is stopped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.parity.parity_deployments import Deployment, celery_deployment, embedded_deployment


@pytest.fixture(params=["embedded", "celery"])
def deployment(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> Iterator[Deployment]:
    """The execution path of this run of the test, with no worker started yet."""
    if request.param == "embedded":
        with embedded_deployment(pg_url, tmp_path) as embedded:
            yield embedded
    else:
        redis_url = str(request.getfixturevalue("redis_url"))
        with celery_deployment(pg_url, redis_url, tmp_path) as celery:
            yield celery
