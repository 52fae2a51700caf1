"""Fixtures of the telemetry tests: the Celery worker tests' deployment (real PostgreSQL, Redis and workers).

The cluster fixtures live beside the Celery worker tests; they are imported from there
rather than copied, so both suites run workers the same way. `redis_url` comes from
`tests/conftest.py`.
"""

from __future__ import annotations

from tests.integration.celery_workers.conftest import database_url, make_cluster, schema_url

__all__ = ["database_url", "make_cluster", "schema_url"]
