"""Fixtures of the telemetry tests: the Celery worker tests' deployment (real PostgreSQL, Redis and workers).

The cluster helpers and their fixtures live beside the Celery worker tests; they are loaded
from there rather than copied, so both suites run workers the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER_TESTS = HERE.parent / "workers"
sys.path.insert(0, str(WORKER_TESTS))

_spec = importlib.util.spec_from_file_location("celery_worker_fixtures", WORKER_TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

database_url = _fixtures.database_url
redis_url = _fixtures.redis_url
schema_url = _fixtures.schema_url
make_cluster = _fixtures.make_cluster
