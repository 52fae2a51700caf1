"""Start-up checks on PostgreSQL: every process refuses a database its code has not been migrated to, naming the fix."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

import store
from store.migrations import alembic_config, head_revision
from tests.helpers.celery_fleet import CeleryFleet
from tests.helpers.processes import REPO_ROOT
from tests.integration.celery_workers.celery_cluster import cluster_env
from workers.api.runtime import build_runtime
from workers.api.server_settings import ApiSettings, WorkerMode
from workers.celery_app.config import create_app
from workers.settings import WorkerSettings
from workers.wiring import build_wiring

pytestmark = pytest.mark.integration

FIX = "agent-runner db upgrade"


def _env(schema_url: str, redis_url: str) -> dict[str, str]:
    return cluster_env(schema_url=schema_url, redis_url=redis_url, namespace=f"ar-check-{uuid.uuid4().hex[:8]}")


def _at_revision(url: str, revision: str) -> None:
    engine = store.make_engine(url)
    try:
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), revision)
    finally:
        engine.dispose()


def test_build_wiring_refuses_a_database_without_tables_and_names_the_command(
    empty_pg_url: str, redis_url: str
) -> None:
    settings = WorkerSettings.from_env(_env(empty_pg_url, redis_url))
    with pytest.raises(store.SchemaVersionError, match=FIX) as raised:
        build_wiring(settings, create_app(settings))
    assert "has no agent-runner tables" in str(raised.value)
    assert raised.value.current is None and raised.value.head == head_revision()


def test_build_wiring_refuses_a_database_an_upgrade_behind(empty_pg_url: str, redis_url: str) -> None:
    _at_revision(empty_pg_url, "0003")
    settings = WorkerSettings.from_env(_env(empty_pg_url, redis_url))
    behind = f"is at schema revision 0003, this version needs {head_revision()}"
    with pytest.raises(store.SchemaVersionError, match=behind):
        build_wiring(settings, create_app(settings))
    # Once migrated, it starts
    store.migrate(empty_pg_url)
    build_wiring(settings, create_app(settings)).close()


def test_a_database_migrated_by_a_newer_version_is_refused_too(empty_pg_url: str) -> None:
    store.migrate(empty_pg_url)
    engine = sa.create_engine(empty_pg_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("UPDATE agent_runner_alembic_version SET version_num = '0099'"))
    finally:
        engine.dispose()
    with pytest.raises(store.SchemaVersionError, match="which this version does not know"):
        store.check_schema(empty_pg_url)


@pytest.mark.parametrize("mode", [WorkerMode.EMBEDDED, WorkerMode.CELERY, WorkerMode.NONE])
def test_the_server_refuses_to_start_on_an_unmigrated_database(
    empty_pg_url: str, redis_url: str, mode: WorkerMode
) -> None:
    settings = ApiSettings.from_env({**_env(empty_pg_url, redis_url), "AGENT_RUNNER_API_WORKER": mode.value})
    with pytest.raises(store.SchemaVersionError, match=FIX):
        build_runtime(settings)


def test_a_celery_worker_exits_at_start_up_on_an_unmigrated_database(
    empty_pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    fleet = CeleryFleet(_env(empty_pg_url, redis_url), tmp_path)
    worker = fleet.start_worker("worker", pool="solo", wait=False)
    try:
        returncode = worker.process.wait(60)
    finally:
        fleet.stop_all()
    output = worker.output()
    assert returncode != 0, output[-3000:]
    assert "agent-runner worker not started" in output and FIX in output
    assert " ready." not in output


def test_the_command_line_names_the_fix_and_works_once_it_is_applied(empty_pg_url: str, redis_url: str) -> None:
    env = _env(empty_pg_url, redis_url)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True
        )

    before = cli("turns", "list")
    assert before.returncode == 1 and FIX in before.stderr
    # Every command that opens the database checks it the same way, the embedded worker included
    for command_line in (("prune", "--older-than", "1d"), ("worker", "--run-for", "0")):
        refused = cli(*command_line)
        assert refused.returncode == 1 and FIX in refused.stderr, (command_line, refused.stderr)
    assert cli("db", "upgrade").returncode == 0
    after = cli("turns", "list")
    assert after.returncode == 0, after.stderr
    assert after.stdout.startswith("no turns in postgresql+psycopg://"), after.stdout
