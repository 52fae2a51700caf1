"""The HTTP server's database pool, in each worker mode: its connections stay open between requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_REDIS_URL
from tests.integration.api.api_server import AGENTS
from tests.integration.celery_workers.celery_cluster import clusters
from workers.api.runtime import build_runtime
from workers.api.server_settings import ApiSettings
from workers.capacity import DEFAULT_POOL

pytestmark = pytest.mark.integration


def test_the_celery_mode_server_keeps_its_database_connections_open_between_requests(
    pg_url: str, tmp_path: Path
) -> None:
    with clusters(pg_url, TEST_REDIS_URL, tmp_path) as make:
        cluster = make(AGENT_RUNNER_AGENT_LOADER=AGENTS)
        runtime = build_runtime(ApiSettings.from_env({**cluster.env, "AGENT_RUNNER_API_WORKER": "celery"}))
        try:
            pool: Any = runtime.engine.pool
            assert (pool.size(), pool._max_overflow) == (DEFAULT_POOL.connections, 0)
        finally:
            runtime.stop()


@pytest.mark.parametrize(("mode", "worker_threads"), [("embedded", 3), ("none", 0)])
def test_the_embedded_and_none_mode_servers_keep_theirs_open_too(pg_url: str, mode: str, worker_threads: int) -> None:
    settings = ApiSettings.from_env(
        {
            "AGENT_RUNNER_DATABASE_URL": pg_url,
            "AGENT_RUNNER_AGENT_LOADER": AGENTS,
            "AGENT_RUNNER_API_WORKER": mode,
            "AGENT_RUNNER_API_WORKER_CONCURRENCY": "3",
        }
    )
    runtime = build_runtime(settings)
    try:
        pool: Any = runtime.engine.pool
        # The requests' connections, and one for each thread of the embedded worker
        assert (pool.size(), pool._max_overflow) == (DEFAULT_POOL.connections + worker_threads, 0)
    finally:
        runtime.stop()
